//! A few thousand mutated JSON bodies (byte flips, truncations, insertions, and values replaced by
//! values of other types, sizes and depths) at both endpoints: every answer is a 200 or an OpenAI
//! error object with a 4xx status, never a 5xx or a dropped connection, and the server is still
//! healthy with no sequence left alive at the end. Deterministic (the project's seed, a fixed count).

use crate::common;

use common::Server;
use serde_json::{json, Value};

const BODIES: usize = 3000;

/// xorshift64*: a fixed sequence of mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn seeds() -> Vec<(&'static str, Value)> {
    vec![
        (
            "/v1/completions",
            json!({"model": "tiny-llada", "prompt": "Tom has 23 apples. He buys 5 more.",
                   "max_tokens": 8, "temperature": 0, "stop": ["Answer"], "seed": 1}),
        ),
        (
            "/v1/completions",
            json!({"prompt": [10, 11, 12], "max_tokens": 4, "block_length": 4, "steps": 4,
                   "strategy": "mbsd", "stream": true,
                   "stream_options": {"canvas": true, "include_usage": true}}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "system", "content": "s"},
                                {"role": "user", "content": "Is the fox young?"}],
                   "max_tokens": 8, "threshold": 0.9, "strategy": "dual-cache"}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                   "max_completion_tokens": 8, "stream": true, "top_p": 1,
                   "strategy": "prefix-cache", "n": 1}),
        ),
    ]
}

/// A value of a random type, size or depth.
fn wild(rng: &mut Rng) -> Value {
    match rng.below(16) {
        0 => Value::Null,
        1 => json!(true),
        2 => json!(-1),
        3 => json!(0),
        4 => json!(u64::MAX),
        5 => json!(1e300),
        6 => json!(-0.5),
        7 => json!(3.5),
        8 => json!(""),
        9 => json!("mbsd"),
        10 => json!("x".repeat(rng.below(600))),
        11 => json!([]),
        12 => json!({}),
        13 => json!([1, "a", null]),
        14 => {
            // Deep nesting (serde_json stops at 128 levels: an error, not a crash).
            let d = rng.below(200);
            serde_json::from_str(&format!("{}{}", "[".repeat(d), "]".repeat(d)))
                .unwrap_or(Value::Null)
        }
        _ => json!(rng.below(300)),
    }
}

fn mutate_value(v: &mut Value, rng: &mut Rng) {
    match v {
        Value::Object(m) if !m.is_empty() && rng.below(4) > 0 => {
            let keys: Vec<String> = m.keys().cloned().collect();
            let k = &keys[rng.below(keys.len())];
            match rng.below(4) {
                0 => {
                    m.remove(k);
                }
                1 => {
                    m.insert(k.clone(), wild(rng));
                }
                2 => {
                    let extra = [
                        "stream_options",
                        "n",
                        "logprobs",
                        "suffix",
                        "unknown",
                        "prompt",
                        "messages",
                    ];
                    m.insert(extra[rng.below(extra.len())].into(), wild(rng));
                }
                _ => mutate_value(m.get_mut(k).expect("key"), rng),
            }
        }
        Value::Array(a) if !a.is_empty() => {
            let i = rng.below(a.len());
            if rng.below(3) == 0 {
                a[i] = wild(rng);
            } else {
                mutate_value(&mut a[i], rng);
            }
        }
        other => *other = wild(rng),
    }
}

fn mutate_bytes(b: &mut Vec<u8>, rng: &mut Rng) {
    for _ in 0..=rng.below(4) {
        if b.is_empty() {
            b.push(b'{');
        }
        let i = rng.below(b.len());
        match rng.below(5) {
            0 => b[i] ^= 1 << rng.below(8),
            1 => b.truncate(i),
            2 => {
                let alphabet = b"{}[]\",:0-e\\\x00\xff";
                b.insert(i, alphabet[rng.below(alphabet.len())]);
            }
            3 => {
                b.remove(i);
            }
            _ => b[i] = rng.below(256) as u8,
        }
    }
}

#[test]
fn mutated_bodies_never_crash_the_server() {
    // Short generations (8 positions unless a body asks for up to 16): the bodies, not the
    // decoding, are under test.
    let s = Server::start(&[
        "--max-tokens-limit",
        "16",
        "--max-body-bytes",
        "65536",
        "--gen-length",
        "8",
        "--block-length",
        "8",
    ]);
    let seeds = seeds();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut ok = 0;
    let mut rejected = 0;
    for n in 0..BODIES {
        let (path, seed) = &seeds[n % seeds.len()];
        let mut v = seed.clone();
        let body = if rng.below(2) == 0 {
            for _ in 0..=rng.below(3) {
                mutate_value(&mut v, &mut rng);
            }
            v.to_string().into_bytes()
        } else {
            let mut b = v.to_string().into_bytes();
            mutate_bytes(&mut b, &mut rng);
            b
        };
        let r = common::request(&s.addr, "POST", path, &body);
        let shown = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        match r.status {
            // A stream that failed inside would carry an error object: only 4xx-kind errors
            // (a parameter the decoder refused) may appear there.
            200 if r.body.contains("server_error") => panic!("{shown}: {}", r.body),
            200 => ok += 1,
            400..=499 => {
                let e = r.json();
                assert!(
                    e["error"]["message"]
                        .as_str()
                        .is_some_and(|m| !m.is_empty()),
                    "{shown}: {e}"
                );
                rejected += 1;
            }
            other => panic!("status {other} for {shown}: {}", r.body),
        }
    }
    eprintln!("{BODIES} bodies: {ok} answered, {rejected} refused with a 4xx");
    assert!(ok > 0 && rejected > 0, "{ok} answered, {rejected} refused");
    let h = s.health();
    assert_eq!(h["live_sequences"], 0, "{h}");
    assert_eq!(h["running_sequences"], 0, "{h}");
}
