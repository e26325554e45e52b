//! Request bodies: JSON deserialized by serde into typed structs (`deny_unknown_fields`), with
//! `serde_path_to_error` naming the field at fault (`max_tokens`, `messages[0].role`,
//! `stream_options.canvas`, ...).
//!
//! The OpenAI fields (`model`, `prompt` / `messages`, `max_tokens`, `temperature`, `top_p`, `stop`,
//! `seed`, `stream`, `stream_options`) and the diffusion fields, spelled as the command-line tools
//! spell them (`strategy`, `steps`, `block_length`, `threshold`). A few OpenAI fields this server
//! cannot honour are accepted only at their neutral value (`n: 1`, `logprobs: null`, penalties 0,
//! ...); anything else unknown is an error, never silently ignored. `null` means "not given".

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::error::Category;
use serde_json::Value;

use crate::error::ApiError;

/// Which endpoint a body was sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/chat/completions`.
    Chat,
}

/// A chat message.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// What to generate from.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    /// Text, encoded as written (`prompt: "..."` or `prompt: ["..."]`).
    Text(String),
    /// Token ids (`prompt: [1, 2, 3]`), used as given.
    Ids(Vec<u32>),
    /// Chat messages, through the model's chat template.
    Messages(Vec<ChatMessage>),
}

/// A validated request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenRequest {
    pub endpoint: Endpoint,
    pub model: Option<String>,
    pub prompt: PromptInput,
    pub max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    /// Nucleus sampling; `1` (no filter) is the same as not given.
    pub top_p: Option<f32>,
    pub stop: Vec<String>,
    pub seed: Option<u64>,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage.
    pub include_usage: bool,
    /// `stream_options.canvas`: the canvas with each position's state at every step.
    pub canvas: bool,
    pub strategy: Option<String>,
    pub steps: Option<usize>,
    pub block_length: Option<usize>,
    pub threshold: Option<f32>,
}

/// Most stop strings a request may give (OpenAI's limit).
pub const MAX_STOP: usize = 4;

/// A body as sent: the fields of both endpoints (each endpoint refuses the other's afterwards).
/// Every field is optional; `null` is the same as absent.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // `user` and the neutral-only fields are checked by reading them, never used
struct Body {
    model: Option<String>,
    prompt: Option<Prompt>,
    messages: Option<Vec<Obj<Message>>>,
    max_tokens: Option<Positive>,
    max_completion_tokens: Option<Positive>,
    temperature: Option<F32>,
    top_p: Option<F32>,
    stop: Option<StringOr<String>>,
    seed: Option<u64>,
    stream: Option<bool>,
    stream_options: Option<Obj<StreamOptions>>,
    strategy: Option<String>,
    steps: Option<Positive>,
    block_length: Option<Positive>,
    threshold: Option<F32>,
    user: Option<String>,
    // Accepted at their neutral values only (`neutral!`).
    n: Option<One>,
    best_of: Option<One>,
    echo: Option<False>,
    suffix: Option<Unsupported>,
    logprobs: Option<False>,
    top_logprobs: Option<Unsupported>,
    presence_penalty: Option<Zero>,
    frequency_penalty: Option<Zero>,
    logit_bias: Option<Empty>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    include_usage: Option<bool>,
    canvas: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Message {
    role: Role,
    content: StringOr<Obj<TextPart>>,
    #[allow(dead_code)]
    name: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum Role {
    System,
    User,
    Assistant,
    /// OpenAI's newer name for `system`.
    Developer,
}

/// A part of a message's content: only `{"type": "text", "text": "..."}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TextPart {
    #[serde(rename = "type")]
    #[allow(dead_code)]
    kind: TextOnly,
    text: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum TextOnly {
    Text,
}

/// A struct read only from a JSON object (serde's derived structs also take an array of the
/// fields in order, which no client means).
struct Obj<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Obj<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Obj<T>, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map)).map(Obj)
            }
        }
        d.deserialize_map(V(PhantomData))
    }
}

/// A positive integer that fits `usize`.
#[derive(Deserialize)]
#[serde(try_from = "u64")]
struct Positive(usize);

impl TryFrom<u64> for Positive {
    type Error = String;
    fn try_from(u: u64) -> Result<Self, String> {
        let n = usize::try_from(u).map_err(|_| format!("{u} is too large"))?;
        (n > 0)
            .then_some(Positive(n))
            .ok_or_else(|| "must be a positive integer, got 0".into())
    }
}

/// A number that fits an `f32` (the library's parameters are `f32`).
#[derive(Deserialize)]
#[serde(try_from = "f64")]
struct F32(f32);

impl TryFrom<f64> for F32 {
    type Error = String;
    fn try_from(f: f64) -> Result<Self, String> {
        let ok = f.is_finite() && f.abs() <= f32::MAX as f64;
        ok.then_some(F32(f as f32))
            .ok_or_else(|| format!("{f} is out of f32's range"))
    }
}

/// A string, or an array of `T` (`stop`, a message's `content`).
enum StringOr<T> {
    One(String),
    List(Vec<T>),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for StringOr<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = StringOr<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an array")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(StringOr::One(s.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = a.next_element()? {
                    v.push(x);
                }
                Ok(StringOr::List(v))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// `prompt`: a string, a one-string array, or token ids (checked as a whole, so that every
/// error names `prompt`).
#[derive(Deserialize)]
#[serde(try_from = "Value")]
struct Prompt(PromptInput);

impl TryFrom<Value> for Prompt {
    type Error = String;

    fn try_from(v: Value) -> Result<Self, String> {
        let a = match v {
            Value::String(s) => return Ok(Prompt(PromptInput::Text(s))),
            Value::Array(a) => a,
            _ => return Err("must be a string or an array of token ids".into()),
        };
        if a.is_empty() {
            Err("is an empty array".into())
        } else if a.iter().all(Value::is_string) {
            match <[Value; 1]>::try_from(a) {
                Ok([Value::String(s)]) => Ok(Prompt(PromptInput::Text(s))),
                Ok(_) => unreachable!("checked: every element is a string"),
                Err(a) => Err(format!(
                    "{} prompts in one request: this server takes one prompt per request \
                     (send the others as separate requests; they run concurrently)",
                    a.len()
                )),
            }
        } else if a.iter().all(Value::is_number) {
            let id = |(i, t): (usize, &Value)| {
                t.as_u64()
                    .and_then(|u| u32::try_from(u).ok())
                    .ok_or_else(|| format!("token id at index {i} ({t}) is not a u32"))
            };
            let ids = a.iter().enumerate().map(id).collect::<Result<_, _>>()?;
            Ok(Prompt(PromptInput::Ids(ids)))
        } else if a.iter().all(Value::is_array) {
            Err(format!(
                "{} token-id prompts in one request: this server takes one prompt per request",
                a.len()
            ))
        } else {
            Err("an array must hold one string or token ids (integers), not a mix".into())
        }
    }
}

/// The fields accepted only at their neutral value (`null` is not given either): a type each,
/// whose deserializer checks the value.
macro_rules! neutral {
    ($($name:ident: $ok:expr, $what:literal;)*) => {$(
        struct $name;
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let ok: fn(&Value) -> bool = $ok;
                match ok(&Value::deserialize(d)?) {
                    true => Ok($name),
                    false => Err(de::Error::custom(concat!("this server supports only ", $what))),
                }
            }
        }
    )*};
}

neutral! {
    One: |v| v.as_u64() == Some(1), "1 (one choice per request)";
    Zero: |v| v.as_f64() == Some(0.0), "0 (no penalties)";
    False: |v| v == &Value::Bool(false), "false (no echo, no log-probabilities)";
    Empty: |v| v.as_object().is_some_and(|o| o.is_empty()), "an empty object (no logit bias)";
    Unsupported: |_| false, "null (suffixes and log-probabilities are not supported)";
}

/// Parse a request body (raw bytes) sent to `endpoint`.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<GenRequest, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let Obj(b): Obj<Body> = serde_path_to_error::deserialize(&mut de).map_err(body_error)?;
    de.end().map_err(invalid_json)?;
    let path = match endpoint {
        Endpoint::Completions => "/v1/completions",
        Endpoint::Chat => "/v1/chat/completions",
    };
    // The other endpoint's fields.
    let foreign: &[(&str, bool)] = match endpoint {
        Endpoint::Completions => &[
            ("messages", b.messages.is_some()),
            ("max_completion_tokens", b.max_completion_tokens.is_some()),
            ("top_logprobs", b.top_logprobs.is_some()),
        ],
        Endpoint::Chat => &[
            ("prompt", b.prompt.is_some()),
            ("echo", b.echo.is_some()),
            ("suffix", b.suffix.is_some()),
            ("best_of", b.best_of.is_some()),
        ],
    };
    if let Some((name, _)) = foreign.iter().find(|f| f.1) {
        let msg = format!("unknown field: POST {path} does not take it");
        return Err(ApiError::field(name, msg).with_code("unknown_field"));
    }
    let prompt = match endpoint {
        Endpoint::Completions => match b.prompt {
            Some(Prompt(p)) => p,
            None => {
                return Err(ApiError::field(
                    "prompt",
                    "required: a string (or an array of token ids)",
                ))
            }
        },
        Endpoint::Chat => messages(b.messages)?,
    };
    let max_tokens = match (b.max_tokens, b.max_completion_tokens) {
        (Some(Positive(t)), Some(Positive(m))) if t != m => {
            return Err(ApiError::field(
                "max_completion_tokens",
                "differs from max_tokens; give one of them",
            ))
        }
        (t, m) => t.or(m).map(|Positive(n)| n),
    };
    let stream = b.stream.unwrap_or(false);
    if b.stream_options.is_some() && !stream {
        return Err(ApiError::field(
            "stream_options",
            "only applies with \"stream\": true",
        ));
    }
    let (include_usage, canvas) = match b.stream_options {
        Some(Obj(o)) => (o.include_usage, o.canvas),
        None => (None, None),
    };
    let f32_of = |f: Option<F32>| f.map(|F32(x)| x);
    Ok(GenRequest {
        endpoint,
        model: b.model,
        prompt,
        max_tokens,
        temperature: f32_of(b.temperature),
        top_p: f32_of(b.top_p).filter(|&p| p != 1.0),
        stop: stop(b.stop)?,
        seed: b.seed,
        stream,
        include_usage: include_usage.unwrap_or(false),
        canvas: canvas.unwrap_or(false),
        strategy: b.strategy,
        steps: b.steps.map(|Positive(n)| n),
        block_length: b.block_length.map(|Positive(n)| n),
        threshold: f32_of(b.threshold),
    })
}

fn messages(list: Option<Vec<Obj<Message>>>) -> Result<PromptInput, ApiError> {
    let list = match list {
        None => {
            return Err(ApiError::field(
                "messages",
                "required: an array of messages",
            ))
        }
        Some(l) if l.is_empty() => return Err(ApiError::field("messages", "is an empty array")),
        Some(l) => l,
    };
    let message = |Obj(m): Obj<Message>| {
        let role = match m.role {
            Role::System | Role::Developer => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        };
        let content = match m.content {
            StringOr::One(s) => s,
            StringOr::List(parts) => parts.into_iter().map(|Obj(p)| p.text).collect(),
        };
        ChatMessage {
            role: role.to_string(),
            content,
        }
    };
    Ok(PromptInput::Messages(
        list.into_iter().map(message).collect(),
    ))
}

fn stop(v: Option<StringOr<String>>) -> Result<Vec<String>, ApiError> {
    let list = match v {
        None => Vec::new(),
        Some(StringOr::One(s)) => vec![s],
        Some(StringOr::List(l)) => l,
    };
    if list.len() > MAX_STOP {
        let msg = format!("{} stop strings; at most {MAX_STOP}", list.len());
        return Err(ApiError::field("stop", msg));
    }
    if let Some(i) = list.iter().position(String::is_empty) {
        return Err(ApiError::field("stop", format!("stop string {i} is empty")));
    }
    Ok(list)
}

/// A body that is not JSON (a syntax error, trailing characters, cut short).
fn invalid_json(e: serde_json::Error) -> ApiError {
    ApiError::request(format!(
        "the body is not valid JSON ({e}); send a JSON object, e.g. {{\"prompt\": \"...\"}}"
    ))
    .with_code("invalid_json")
}

/// A deserialization error as a 400 naming the field: the path to the value at fault. For a
/// missing or duplicate field the path stops at the object holding it, so the field serde names
/// in its message is appended.
fn body_error(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    if inner.classify() != Category::Data {
        return invalid_json(inner);
    }
    let full = inner.to_string();
    let at = format!(" at line {} column {}", inner.line(), inner.column());
    let msg = full.strip_suffix(&at).unwrap_or(&full);
    let named = ["missing field `", "duplicate field `"]
        .iter()
        .find_map(|p| msg.strip_prefix(p))
        .and_then(|r| r.split('`').next());
    let param = match (path.as_str(), named) {
        (".", None) => return ApiError::request(format!("the body must be a JSON object: {msg}")),
        (".", Some(f)) => f.to_string(),
        (p, Some(f)) => format!("{p}.{f}"),
        (p, None) => p.to_string(),
    };
    let code = match msg {
        m if m.starts_with("unknown field") => "unknown_field",
        m if m.starts_with("this server supports only") => "unsupported_value",
        _ => "invalid_value",
    };
    ApiError::field(&param, msg).with_code(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(endpoint: Endpoint, body: &str) -> ApiError {
        parse(endpoint, body.as_bytes()).expect_err(body)
    }

    #[test]
    fn errors_name_the_field() {
        use Endpoint::*;
        let table: &[(Endpoint, &str, Option<&str>)] = &[
            (
                Completions,
                r#"{"prompt": "a", "max_tokens": "10"}"#,
                Some("max_tokens"),
            ),
            (
                Completions,
                r#"{"prompt": "a", "max_tokens": -1}"#,
                Some("max_tokens"),
            ),
            (
                Completions,
                r#"{"prompt": "a", "max_tokens": 0}"#,
                Some("max_tokens"),
            ),
            (
                Completions,
                r#"{"prompt": "a", "max_tokens": 1e40}"#,
                Some("max_tokens"),
            ),
            (
                Completions,
                r#"{"prompt": "a", "max_tokens": 99999999999999999999999}"#,
                Some("max_tokens"),
            ),
            (Completions, r#"{"prompt": 5}"#, Some("prompt")),
            (Completions, "{}", Some("prompt")),
            (Completions, r#"{"prompt": ["a", "b"]}"#, Some("prompt")),
            (Completions, r#"{"prompt": [1, -2]}"#, Some("prompt")),
            (
                Completions,
                r#"{"prompt": "a", "temperature": "hot"}"#,
                Some("temperature"),
            ),
            (
                Completions,
                r#"{"prompt": "a", "temperature": 1e300}"#,
                Some("temperature"),
            ),
            (Completions, r#"{"prompt": "a", "stop": 3}"#, Some("stop")),
            (
                Completions,
                r#"{"prompt": "a", "stop": [""]}"#,
                Some("stop"),
            ),
            (
                Completions,
                r#"{"prompt": "a", "stop": ["a","b","c","d","e"]}"#,
                Some("stop"),
            ),
            (Completions, r#"{"prompt": "a", "seed": -1}"#, Some("seed")),
            (
                Completions,
                r#"{"prompt": "a", "stream": 1}"#,
                Some("stream"),
            ),
            (
                Completions,
                r#"{"prompt": "a", "stream_options": {"canvas": true}}"#,
                Some("stream_options"),
            ),
            (
                Completions,
                r#"{"prompt": "a", "stream": true, "stream_options": {"canvas": 1}}"#,
                Some("stream_options.canvas"),
            ),
            (
                Completions,
                r#"{"prompt": "a", "stream": true, "stream_options": {"x": 1}}"#,
                Some("stream_options.x"),
            ),
            (
                Completions,
                r#"{"prompt": "a", "strategy": 3}"#,
                Some("strategy"),
            ),
            (
                Completions,
                r#"{"prompt": "a", "steps": 2.5}"#,
                Some("steps"),
            ),
            (
                Completions,
                r#"{"prompt": "a", "block_length": 0}"#,
                Some("block_length"),
            ),
            (
                Completions,
                r#"{"prompt": "a", "threshold": "x"}"#,
                Some("threshold"),
            ),
            (Completions, r#"{"prompt": "a", "n": 2}"#, Some("n")),
            (
                Completions,
                r#"{"prompt": "a", "frobnicate": 2}"#,
                Some("frobnicate"),
            ),
            (
                Completions,
                r#"{"prompt": "a", "messages": []}"#,
                Some("messages"),
            ),
            (Chat, r#"{"messages": "hi"}"#, Some("messages")),
            (Chat, r#"{"messages": []}"#, Some("messages")),
            (
                Chat,
                r#"{"messages": [{"role": "pirate", "content": "a"}]}"#,
                Some("messages[0].role"),
            ),
            (
                Chat,
                r#"{"messages": [{"role": "user"}]}"#,
                Some("messages[0].content"),
            ),
            (
                Chat,
                r#"{"messages": [{"role": "user", "content": 1}]}"#,
                Some("messages[0].content"),
            ),
            (
                Chat,
                r#"{"messages": [{"role": "user", "content": "a"}], "prompt": "a"}"#,
                Some("prompt"),
            ),
            (Completions, "[1, 2]", None),
            (Completions, r#"{"prompt": "#, None),
            (Completions, "", None),
        ];
        for (endpoint, body, param) in table {
            let e = err(*endpoint, body);
            assert_eq!(e.status.as_u16(), 400, "{body}");
            assert_eq!(e.param.as_deref(), *param, "{body}: {}", e.message);
            if let Some(p) = param {
                assert!(e.message.contains(p), "{body}: {}", e.message);
            }
        }
    }

    #[test]
    fn a_full_request_parses() {
        let r = parse(
            Endpoint::Completions,
            br#"{"model": "m", "prompt": ["hi"], "max_tokens": 40, "temperature": 0, "top_p": 1,
                "stop": "\n", "seed": 7, "stream": true,
                "stream_options": {"include_usage": true, "canvas": true},
                "strategy": "mbsd", "steps": 8, "block_length": 8, "threshold": 0.9,
                "n": 1, "logprobs": null, "user": "u", "presence_penalty": 0}"#,
        )
        .unwrap();
        assert_eq!(r.prompt, PromptInput::Text("hi".into()));
        assert_eq!(r.max_tokens, Some(40));
        assert_eq!(r.top_p, None, "top_p 1 is no filter");
        assert_eq!(r.stop, vec!["\n".to_string()]);
        assert_eq!(
            (r.seed, r.stream, r.include_usage, r.canvas),
            (Some(7), true, true, true)
        );
        assert_eq!(r.strategy.as_deref(), Some("mbsd"));
        assert_eq!(
            (r.steps, r.block_length, r.threshold),
            (Some(8), Some(8), Some(0.9))
        );
        let c = parse(
            Endpoint::Chat,
            br#"{"messages": [{"role": "system", "content": "s"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                "max_completion_tokens": 5}"#,
        )
        .unwrap();
        assert_eq!(c.max_tokens, Some(5));
        let PromptInput::Messages(m) = c.prompt else {
            panic!("messages")
        };
        assert_eq!(m[1].content, "ab");
        assert_eq!(
            parse(Endpoint::Completions, br#"{"prompt": [1, 2, 3]}"#)
                .unwrap()
                .prompt,
            PromptInput::Ids(vec![1, 2, 3])
        );
    }

    #[test]
    fn unknown_fields_are_named_at_any_depth() {
        use Endpoint::*;
        let table: &[(Endpoint, &str, &str, &str)] = &[
            (
                Completions,
                r#"{"prompt": "a", "colour": 1}"#,
                "colour",
                "unknown_field",
            ),
            (
                Completions,
                r#"{"prompt": "a", "stream": true, "stream_options": {"canvas": true, "x": 1}}"#,
                "stream_options.x",
                "unknown_field",
            ),
            (
                Chat,
                r#"{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b", "tone": 1}]}"#,
                "messages[1].tone",
                "unknown_field",
            ),
            (
                Chat,
                r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "x": 0}]}]}"#,
                "messages[0].content[0].x",
                "unknown_field",
            ),
            (
                Chat,
                r#"{"messages": [{"role": "user", "content": [{"type": "image_url", "text": "a"}]}]}"#,
                "messages[0].content[0].type",
                "invalid_value",
            ),
            // The other endpoint's fields are unknown here.
            (
                Completions,
                r#"{"prompt": "a", "max_completion_tokens": 4}"#,
                "max_completion_tokens",
                "unknown_field",
            ),
            (
                Chat,
                r#"{"messages": [{"role": "user", "content": "a"}], "echo": false}"#,
                "echo",
                "unknown_field",
            ),
            // A field given twice is refused, not decided by order.
            (
                Completions,
                r#"{"prompt": "a", "prompt": "b"}"#,
                "prompt",
                "invalid_value",
            ),
            // Objects are objects: serde's derived structs would take an array of the fields.
            (
                Chat,
                r#"{"messages": [["user", "a"]]}"#,
                "messages[0]",
                "invalid_value",
            ),
            (
                Completions,
                r#"{"prompt": "a", "stream": true, "stream_options": [true, true]}"#,
                "stream_options",
                "invalid_value",
            ),
            (
                Completions,
                r#"{"prompt": "a", "stop": ["x", 3]}"#,
                "stop[1]",
                "invalid_value",
            ),
            (
                Completions,
                r#"{"prompt": "a", "logprobs": 2}"#,
                "logprobs",
                "unsupported_value",
            ),
        ];
        for (endpoint, body, param, code) in table {
            let e = err(*endpoint, body);
            assert_eq!(e.status.as_u16(), 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(*param), "{body}: {}", e.message);
            assert_eq!(e.code, Some(*code), "{body}: {}", e.message);
            assert!(e.message.contains(param), "{body}: {}", e.message);
            assert!(!e.message.contains(" at line "), "{body}: {}", e.message);
        }
        // The top level must be an object.
        let e = err(Completions, r#"["a"]"#);
        assert_eq!(
            (e.param, e.code),
            (None, Some("invalid_request")),
            "{}",
            e.message
        );
    }

    #[test]
    fn null_means_not_given_and_neutral_values_pass() {
        let r = parse(
            Endpoint::Completions,
            br#"{"prompt": "a", "max_tokens": null, "stop": null, "stream_options": null,
                "n": 1, "best_of": 1, "echo": false, "logprobs": false, "suffix": null,
                "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {},
                "messages": null, "max_completion_tokens": null, "top_logprobs": null}"#,
        )
        .unwrap();
        assert_eq!((r.max_tokens, r.stream, r.canvas), (None, false, false));
        assert!(r.stop.is_empty());
        let c = parse(
            Endpoint::Chat,
            br#"{"messages": [{"role": "developer", "content": "s", "name": "x"},
                {"role": "assistant", "content": "b"}], "prompt": null, "max_tokens": 3,
                "max_completion_tokens": 3, "stream": false, "stream_options": null}"#,
        )
        .unwrap();
        assert_eq!(c.max_tokens, Some(3));
        let PromptInput::Messages(m) = c.prompt else {
            panic!("messages")
        };
        assert_eq!(
            (m[0].role.as_str(), m[1].role.as_str()),
            ("system", "assistant")
        );
    }
}
