//! Request bodies: parsed field by field from JSON, so that every error names the field at fault.
//!
//! The OpenAI fields (`model`, `prompt` / `messages`, `max_tokens`, `temperature`, `top_p`, `stop`,
//! `seed`, `stream`, `stream_options`) and the diffusion fields, spelled as the command-line tools
//! spell them (`strategy`, `steps`, `block_length`, `threshold`). A few OpenAI fields this server
//! cannot honour are accepted only at their neutral value (`n: 1`, `logprobs: null`, penalties 0,
//! ...); anything else unknown is an error, never silently ignored. `null` means "not given".

use serde_json::{Map, Value};

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

const COMMON: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "stream",
    "stream_options",
    "strategy",
    "steps",
    "block_length",
    "threshold",
    "n",
    "user",
    "logprobs",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
];
const COMPLETIONS_ONLY: &[&str] = &["prompt", "echo", "suffix", "best_of"];
const CHAT_ONLY: &[&str] = &["messages", "max_completion_tokens", "top_logprobs"];

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_u64() || n.is_i64() => "an integer",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

struct Fields<'a>(&'a Map<String, Value>);

impl<'a> Fields<'a> {
    fn get(&self, name: &str) -> Option<&'a Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    /// A positive integer (`what` describes the range in errors).
    fn positive(&self, name: &str) -> Result<Option<usize>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        match v {
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    if u == 0 {
                        return Err(ApiError::field(name, "must be a positive integer, got 0"));
                    }
                    return usize::try_from(u)
                        .map(Some)
                        .map_err(|_| ApiError::field(name, format!("{u} is too large")));
                }
                if let Some(i) = n.as_i64() {
                    return Err(ApiError::field(
                        name,
                        format!("must be a positive integer, got {i}"),
                    ));
                }
                Err(ApiError::field(
                    name,
                    format!("must be a positive integer, got {n}"),
                ))
            }
            other => Err(ApiError::field(
                name,
                format!("must be a positive integer, got {}", type_name(other)),
            )),
        }
    }

    fn number(&self, name: &str) -> Result<Option<f64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_f64()
                .filter(|f| f.is_finite())
                .map(Some)
                .ok_or_else(|| ApiError::field(name, format!("{n} is not a finite number"))),
            Some(other) => Err(ApiError::field(
                name,
                format!("must be a number, got {}", type_name(other)),
            )),
        }
    }

    /// A number that fits an `f32` (the library's parameters are `f32`).
    fn number_f32(&self, name: &str) -> Result<Option<f32>, ApiError> {
        match self.number(name)? {
            None => Ok(None),
            Some(f) if f.abs() > f32::MAX as f64 => {
                Err(ApiError::field(name, format!("{f} is out of range")))
            }
            Some(f) => Ok(Some(f as f32)),
        }
    }

    fn boolean(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(ApiError::field(
                name,
                format!("must be a boolean, got {}", type_name(other)),
            )),
        }
    }

    fn string(&self, name: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(ApiError::field(
                name,
                format!("must be a string, got {}", type_name(other)),
            )),
        }
    }

    /// A field this server accepts only at its neutral value.
    fn neutral(&self, name: &str, ok: impl Fn(&Value) -> bool, what: &str) -> Result<(), ApiError> {
        match self.get(name) {
            Some(v) if !ok(v) => Err(ApiError::field(
                name,
                format!("this server supports only {what}"),
            )
            .with_code("unsupported_value")),
            _ => Ok(()),
        }
    }
}

/// Parse a request body (raw bytes) sent to `endpoint`.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<GenRequest, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::request(format!(
            "the body is not valid JSON ({e}); send a JSON object, e.g. {{\"prompt\": \"...\"}}"
        ))
        .with_code("invalid_json")
    })?;
    let Value::Object(map) = v else {
        return Err(ApiError::request(format!(
            "the body must be a JSON object, got {}",
            type_name(&v)
        )));
    };
    let only: &[&str] = match endpoint {
        Endpoint::Completions => COMPLETIONS_ONLY,
        Endpoint::Chat => CHAT_ONLY,
    };
    for key in map.keys() {
        if !COMMON.contains(&key.as_str()) && !only.contains(&key.as_str()) {
            let mut known: Vec<&str> = COMMON.iter().chain(only).copied().collect();
            known.sort_unstable();
            return Err(ApiError::field(
                key,
                format!("unknown field; this endpoint accepts {}", known.join(", ")),
            )
            .with_code("unknown_field"));
        }
    }
    let f = Fields(&map);
    let prompt = match endpoint {
        Endpoint::Completions => parse_prompt(f.get("prompt"))?,
        Endpoint::Chat => parse_messages(f.get("messages"))?,
    };
    let mut max_tokens = f.positive("max_tokens")?;
    if endpoint == Endpoint::Chat {
        if let Some(m) = f.positive("max_completion_tokens")? {
            if max_tokens.is_some_and(|t| t != m) {
                return Err(ApiError::field(
                    "max_completion_tokens",
                    "differs from max_tokens; give one of them",
                ));
            }
            max_tokens = Some(m);
        }
    }
    let temperature = f.number_f32("temperature")?;
    let top_p = f.number_f32("top_p")?.filter(|&p| p != 1.0);
    let stop = parse_stop(f.get("stop"))?;
    let seed = match f.get("seed") {
        None => None,
        Some(Value::Number(n)) if n.as_u64().is_some() => n.as_u64(),
        Some(other) => {
            return Err(ApiError::field(
                "seed",
                format!("must be a non-negative integer, got {}", describe(other)),
            ))
        }
    };
    let stream = f.boolean("stream")?.unwrap_or(false);
    let (mut include_usage, mut canvas) = (false, false);
    match f.get("stream_options") {
        None => {}
        Some(Value::Object(o)) => {
            if !stream {
                return Err(ApiError::field(
                    "stream_options",
                    "only applies with \"stream\": true",
                ));
            }
            for key in o.keys() {
                if key != "include_usage" && key != "canvas" {
                    return Err(ApiError::field(
                        &format!("stream_options.{key}"),
                        "unknown option; stream_options accepts include_usage and canvas",
                    )
                    .with_code("unknown_field"));
                }
            }
            let o = Fields(o);
            include_usage = o
                .boolean("include_usage")
                .map_err(|e| rename(e, "stream_options.include_usage"))?
                .unwrap_or(false);
            canvas = o
                .boolean("canvas")
                .map_err(|e| rename(e, "stream_options.canvas"))?
                .unwrap_or(false);
        }
        Some(other) => {
            return Err(ApiError::field(
                "stream_options",
                format!("must be an object, got {}", type_name(other)),
            ))
        }
    }
    let strategy = f.string("strategy")?.map(str::to_string);
    let steps = f.positive("steps")?;
    let block_length = f.positive("block_length")?;
    let threshold = f.number_f32("threshold")?;
    // Accepted at their neutral values only.
    let is_one = |v: &Value| v.as_u64() == Some(1);
    let is_zero = |v: &Value| v.as_f64() == Some(0.0);
    let is_false = |v: &Value| v.as_bool() == Some(false);
    let is_empty_object = |v: &Value| v.as_object().is_some_and(Map::is_empty);
    f.neutral("n", is_one, "n = 1 (one choice per request)")?;
    f.neutral("best_of", is_one, "best_of = 1")?;
    f.neutral("presence_penalty", is_zero, "presence_penalty = 0")?;
    f.neutral("frequency_penalty", is_zero, "frequency_penalty = 0")?;
    f.neutral("echo", is_false, "echo = false")?;
    f.neutral("logit_bias", is_empty_object, "an empty logit_bias")?;
    f.neutral(
        "suffix",
        |_| false,
        "no suffix (insertion is not supported)",
    )?;
    f.neutral(
        "logprobs",
        is_false,
        "logprobs = null or false (log-probabilities are not returned)",
    )?;
    f.neutral(
        "top_logprobs",
        |_| false,
        "top_logprobs = null (log-probabilities are not returned)",
    )?;
    f.string("user")?;
    let model = f.string("model")?.map(str::to_string);
    Ok(GenRequest {
        endpoint,
        model,
        prompt,
        max_tokens,
        temperature,
        top_p,
        stop,
        seed,
        stream,
        include_usage,
        canvas,
        strategy,
        steps,
        block_length,
        threshold,
    })
}

fn describe(v: &Value) -> String {
    match v {
        Value::Number(n) => n.to_string(),
        other => type_name(other).to_string(),
    }
}

fn rename(mut e: ApiError, param: &str) -> ApiError {
    if let Some(old) = e.param.replace(param.to_string()) {
        e.message = e
            .message
            .replacen(&format!("`{old}`"), &format!("`{param}`"), 1);
    }
    e
}

fn parse_prompt(v: Option<&Value>) -> Result<PromptInput, ApiError> {
    let bad = |m: String| Err(ApiError::field("prompt", m));
    match v {
        None => bad("required: a string (or an array of token ids)".into()),
        Some(Value::String(s)) => Ok(PromptInput::Text(s.clone())),
        Some(Value::Array(a)) if a.is_empty() => bad("is an empty array".into()),
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
            if a.len() > 1 {
                return bad(format!(
                    "{} prompts in one request: this server takes one prompt per request \
                     (send the others as separate requests; they run concurrently)",
                    a.len()
                ));
            }
            Ok(PromptInput::Text(
                a[0].as_str().unwrap_or_default().to_string(),
            ))
        }
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => {
            let mut ids = Vec::with_capacity(a.len());
            for (i, t) in a.iter().enumerate() {
                match t.as_u64().and_then(|u| u32::try_from(u).ok()) {
                    Some(id) => ids.push(id),
                    None => return bad(format!("token id at index {i} ({t}) is not a u32")),
                }
            }
            Ok(PromptInput::Ids(ids))
        }
        Some(Value::Array(a)) if a.iter().all(Value::is_array) => bad(format!(
            "{} token-id prompts in one request: this server takes one prompt per request",
            a.len()
        )),
        Some(Value::Array(_)) => {
            bad("an array must hold one string or token ids (integers), not a mix".into())
        }
        Some(other) => bad(format!(
            "must be a string or an array of token ids, got {}",
            type_name(other)
        )),
    }
}

fn parse_messages(v: Option<&Value>) -> Result<PromptInput, ApiError> {
    let list = match v {
        None => {
            return Err(ApiError::field(
                "messages",
                "required: an array of messages",
            ))
        }
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(ApiError::field("messages", "is an empty array"))
        }
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(ApiError::field(
                "messages",
                format!("must be an array of messages, got {}", type_name(other)),
            ))
        }
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let at = |field: &str| format!("messages[{i}].{field}");
        let Value::Object(o) = m else {
            return Err(ApiError::field(
                &format!("messages[{i}]"),
                format!(
                    "must be an object with role and content, got {}",
                    type_name(m)
                ),
            ));
        };
        let role = match o.get("role") {
            Some(Value::String(r))
                if ["system", "user", "assistant", "developer"].contains(&r.as_str()) =>
            {
                if r == "developer" {
                    "system".to_string()
                } else {
                    r.clone()
                }
            }
            Some(Value::String(r)) => {
                return Err(ApiError::field(
                    &at("role"),
                    format!("`{r}` (expected system, user or assistant)"),
                ))
            }
            Some(other) => {
                return Err(ApiError::field(
                    &at("role"),
                    format!("must be a string, got {}", type_name(other)),
                ))
            }
            None => return Err(ApiError::field(&at("role"), "required")),
        };
        let content =
            match o.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => {
                    let mut s = String::new();
                    for (j, p) in parts.iter().enumerate() {
                        match (p.get("type").and_then(Value::as_str), p.get("text")) {
                            (Some("text"), Some(Value::String(t))) => s.push_str(t),
                            _ => return Err(ApiError::field(
                                &format!("messages[{i}].content[{j}]"),
                                "only {\"type\": \"text\", \"text\": \"...\"} parts are supported",
                            )),
                        }
                    }
                    s
                }
                Some(other) => {
                    return Err(ApiError::field(
                        &at("content"),
                        format!(
                            "must be a string or an array of text parts, got {}",
                            type_name(other)
                        ),
                    ))
                }
                None => return Err(ApiError::field(&at("content"), "required")),
            };
        for key in o.keys() {
            if key != "role" && key != "content" && key != "name" {
                return Err(ApiError::field(
                    &at(key),
                    "unknown field; a message has role and content",
                )
                .with_code("unknown_field"));
            }
        }
        out.push(ChatMessage { role, content });
    }
    Ok(PromptInput::Messages(out))
}

fn parse_stop(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let list: Vec<&Value> = match v {
        None => return Ok(Vec::new()),
        Some(s @ Value::String(_)) => vec![s],
        Some(Value::Array(a)) => a.iter().collect(),
        Some(other) => {
            return Err(ApiError::field(
                "stop",
                format!(
                    "must be a string or an array of strings, got {}",
                    type_name(other)
                ),
            ))
        }
    };
    if list.len() > MAX_STOP {
        return Err(ApiError::field(
            "stop",
            format!("{} stop strings; at most {MAX_STOP}", list.len()),
        ));
    }
    let mut out = Vec::new();
    for (i, s) in list.into_iter().enumerate() {
        match s {
            Value::String(s) if s.is_empty() => {
                return Err(ApiError::field("stop", format!("stop string {i} is empty")))
            }
            Value::String(s) => out.push(s.clone()),
            other => {
                return Err(ApiError::field(
                    "stop",
                    format!("stop string {i} must be a string, got {}", type_name(other)),
                ))
            }
        }
    }
    Ok(out)
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
                "{\"prompt\": \"a\", \"max_tokens\": \"10\"}",
                Some("max_tokens"),
            ),
            (
                Completions,
                "{\"prompt\": \"a\", \"max_tokens\": -1}",
                Some("max_tokens"),
            ),
            (
                Completions,
                "{\"prompt\": \"a\", \"max_tokens\": 0}",
                Some("max_tokens"),
            ),
            (
                Completions,
                "{\"prompt\": \"a\", \"max_tokens\": 1e40}",
                Some("max_tokens"),
            ),
            (
                Completions,
                "{\"prompt\": \"a\", \"max_tokens\": 99999999999999999999999}",
                Some("max_tokens"),
            ),
            (Completions, "{\"prompt\": 5}", Some("prompt")),
            (Completions, "{}", Some("prompt")),
            (Completions, "{\"prompt\": [\"a\", \"b\"]}", Some("prompt")),
            (Completions, "{\"prompt\": [1, -2]}", Some("prompt")),
            (
                Completions,
                "{\"prompt\": \"a\", \"temperature\": \"hot\"}",
                Some("temperature"),
            ),
            (
                Completions,
                "{\"prompt\": \"a\", \"temperature\": 1e300}",
                Some("temperature"),
            ),
            (
                Completions,
                "{\"prompt\": \"a\", \"stop\": 3}",
                Some("stop"),
            ),
            (
                Completions,
                "{\"prompt\": \"a\", \"stop\": [\"\"]}",
                Some("stop"),
            ),
            (
                Completions,
                "{\"prompt\": \"a\", \"stop\": [\"a\",\"b\",\"c\",\"d\",\"e\"]}",
                Some("stop"),
            ),
            (
                Completions,
                "{\"prompt\": \"a\", \"seed\": -1}",
                Some("seed"),
            ),
            (
                Completions,
                "{\"prompt\": \"a\", \"stream\": 1}",
                Some("stream"),
            ),
            (
                Completions,
                "{\"prompt\": \"a\", \"stream_options\": {\"canvas\": true}}",
                Some("stream_options"),
            ),
            (
                Completions,
                "{\"prompt\": \"a\", \"stream\": true, \"stream_options\": {\"canvas\": 1}}",
                Some("stream_options.canvas"),
            ),
            (
                Completions,
                "{\"prompt\": \"a\", \"stream\": true, \"stream_options\": {\"x\": 1}}",
                Some("stream_options.x"),
            ),
            (
                Completions,
                "{\"prompt\": \"a\", \"strategy\": 3}",
                Some("strategy"),
            ),
            (
                Completions,
                "{\"prompt\": \"a\", \"steps\": 2.5}",
                Some("steps"),
            ),
            (
                Completions,
                "{\"prompt\": \"a\", \"block_length\": 0}",
                Some("block_length"),
            ),
            (
                Completions,
                "{\"prompt\": \"a\", \"threshold\": \"x\"}",
                Some("threshold"),
            ),
            (Completions, "{\"prompt\": \"a\", \"n\": 2}", Some("n")),
            (
                Completions,
                "{\"prompt\": \"a\", \"frobnicate\": 2}",
                Some("frobnicate"),
            ),
            (
                Completions,
                "{\"prompt\": \"a\", \"messages\": []}",
                Some("messages"),
            ),
            (Chat, "{\"messages\": \"hi\"}", Some("messages")),
            (Chat, "{\"messages\": []}", Some("messages")),
            (
                Chat,
                "{\"messages\": [{\"role\": \"pirate\", \"content\": \"a\"}]}",
                Some("messages[0].role"),
            ),
            (
                Chat,
                "{\"messages\": [{\"role\": \"user\"}]}",
                Some("messages[0].content"),
            ),
            (
                Chat,
                "{\"messages\": [{\"role\": \"user\", \"content\": 1}]}",
                Some("messages[0].content"),
            ),
            (
                Chat,
                "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"prompt\": \"a\"}",
                Some("prompt"),
            ),
            (Completions, "[1, 2]", None),
            (Completions, "{\"prompt\": ", None),
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
}
