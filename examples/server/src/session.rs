//! One request: its prompt and parameters checked ([`prepare`]), and its [`Session`] — what the
//! engine keeps beside the request's generation to turn its steps into [`Event`]s: the final
//! text as it grows (through `dllm_decode::FinalTextStream`), stop strings applied, and the canvas
//! when asked for.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use dllm_decode::params::{DEFAULT_BLOCK_LENGTH, DEFAULT_GEN_LENGTH};
use dllm_decode::states::TokenState;
use dllm_decode::{DecodeError, DecodeParams, FinalTextStream, Outcome, StepEvent};
use dllm_models::source::DecodeDefaults;
use dllm_models::{Message, ModelInfo, TextTokenizer};
use llada_cli::DecodeArgs;
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedSender;

use crate::engine::Engine;
use crate::error::ApiError;
use crate::metrics::Stats;
use crate::request::{Endpoint, GenRequest, PromptInput};

/// The server's limits.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_sequences: usize,
    pub max_queue: usize,
    pub max_batch_rows: usize,
    pub max_body_bytes: usize,
    pub max_tokens: usize,
    pub timeout_secs: f64,
}

/// Everything the request handlers share.
pub struct Shared {
    pub model_id: String,
    pub info: ModelInfo,
    pub tokenizer: Option<Arc<TextTokenizer>>,
    pub checkpoint: DecodeDefaults,
    /// The decoding flags the server was started with: a request's fields override them.
    pub decode: DecodeArgs,
    pub engine: Arc<Engine>,
    pub stats: Arc<Stats>,
    pub limits: Limits,
    pub created: u64,
}

/// A request ready to run.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub endpoint: Endpoint,
    pub prompt_ids: Vec<u32>,
    pub params: DecodeParams,
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub canvas: bool,
}

fn prompt_field(e: Endpoint) -> &'static str {
    match e {
        Endpoint::Completions => "prompt",
        Endpoint::Chat => "messages",
    }
}

/// What the engine reports to a request's handler.
#[derive(Debug)]
pub enum Event {
    /// A step: the text that became final (may be empty) and, with `canvas`, the canvas.
    Step {
        delta: String,
        canvas: Option<Value>,
    },
    /// The end: the last text and the summary.
    Done { delta: String, summary: Summary },
    /// The request failed (bad parameters found by the decoder, timeout, internal error).
    Failed(ApiError),
}

/// How a generation ended.
#[derive(Debug, Clone)]
pub struct Summary {
    pub finish_reason: &'static str,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// The `diffusion` object of the response.
    pub diffusion: Value,
}

/// A library error as an OpenAI error naming the request field.
pub fn decode_error(e: DecodeError, endpoint: Endpoint) -> ApiError {
    match e {
        DecodeError::InvalidParam { name, reason } => {
            let reason = reason.replace("gen_length", "max_tokens");
            let field = match name {
                "gen_length" => "max_tokens".to_string(),
                "block_length" | "steps" | "strategy" | "threshold" | "temperature" | "seed" => {
                    name.to_string()
                }
                "dream.top_p" => "top_p".to_string(),
                // Set by the server's own flags, not by the request.
                other => format!(
                    "{} (server flag {})",
                    other,
                    llada_cli::flag_of(other).unwrap_or("?")
                ),
            };
            ApiError::field(&field, reason)
        }
        DecodeError::InvalidPrompt(m) => ApiError::field(prompt_field(endpoint), m),
        other => ApiError::server(other.to_string()),
    }
}

/// Check a request against the model and the server's limits, and resolve its decoding
/// parameters exactly as `generate` resolves its flags.
pub fn prepare(shared: &Shared, req: GenRequest) -> Result<Prepared, ApiError> {
    check_model(shared, req.model.as_deref())?;
    let prompt_ids = prompt_ids(shared, &req)?;
    let a = decode_args(shared, &req)?;
    let params = a
        .resolve(&shared.checkpoint, shared.info.shift_logits)
        .map_err(|e| decode_error(e, req.endpoint))?;
    check_context(&shared.info, &req, prompt_ids.len(), params.gen_length)?;
    Ok(Prepared {
        endpoint: req.endpoint,
        prompt_ids,
        params,
        max_tokens: req.max_tokens,
        stop: req.stop,
        stream: req.stream,
        include_usage: req.include_usage,
        canvas: req.canvas,
    })
}

/// A request naming a model must name the one served here.
fn check_model(shared: &Shared, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(m) if m != shared.model_id => Err(ApiError::field(
            "model",
            format!(
                "`{m}` is not served here; this server serves `{}` (GET /v1/models)",
                shared.model_id
            ),
        )
        .status(axum::http::StatusCode::NOT_FOUND)
        .with_code("model_not_found")),
        _ => Ok(()),
    }
}

/// The prompt as token ids (text encoded, chat messages through the template), checked against
/// the vocabulary: not empty, no id outside it, no mask id.
fn prompt_ids(shared: &Shared, req: &GenRequest) -> Result<Vec<u32>, ApiError> {
    let pf = prompt_field(req.endpoint);
    let tok = || {
        shared.tokenizer.as_ref().ok_or_else(|| {
            ApiError::field(
                pf,
                "this model has no tokenizer: send the prompt as token ids (\"prompt\": [1, 2, 3])",
            )
        })
    };
    let prompt_ids = match &req.prompt {
        PromptInput::Ids(ids) => ids.clone(),
        // Typed special-token strings (`[MASK]`, `<eos>`) are text, as in `generate`.
        PromptInput::Text(t) => tok()?
            .encode_prompt(t, false)
            .map_err(|e| ApiError::field(pf, e.to_string()))?,
        PromptInput::Messages(m) => {
            let msgs: Vec<Message> = m
                .iter()
                .map(|m| Message {
                    role: m.role.clone(),
                    content: m.content.clone(),
                })
                .collect();
            tok()?
                .encode_chat(&msgs)
                .map_err(|e| ApiError::field(pf, e.to_string()))?
        }
    };
    if prompt_ids.is_empty() {
        return Err(ApiError::field(pf, "encodes to no tokens"));
    }
    let info = &shared.info;
    if let Some((i, &t)) = prompt_ids
        .iter()
        .enumerate()
        .find(|(_, &t)| t as usize >= info.vocab_size || t == info.special.mask)
    {
        return Err(ApiError::field(
            pf,
            if t == info.special.mask {
                format!("token {i} is the mask id {t}")
            } else {
                format!(
                    "token id {t} at {i} is outside the vocabulary ({} ids)",
                    info.vocab_size
                )
            },
        ));
    }
    Ok(prompt_ids)
}

/// The server's decoding flags with the request's fields over them; `max_tokens`, rounded up to
/// whole blocks (any length is whole when the answer is one block), is the generation length
/// (within the server's limit).
fn decode_args(shared: &Shared, req: &GenRequest) -> Result<DecodeArgs, ApiError> {
    let mut a = shared.decode.clone();
    if let Some(s) = &req.strategy {
        a.strategy = s.clone();
    }
    if let Some(t) = req.temperature {
        a.temperature = t;
    }
    if let Some(s) = req.seed {
        a.seed = s;
    }
    if req.top_p.is_some() {
        a.top_p = req.top_p;
    }
    if req.steps.is_some() {
        a.steps = req.steps;
    }
    if req.threshold.is_some() {
        a.threshold = req.threshold;
    }
    if req.block_length.is_some() {
        a.block_length = req.block_length;
    }
    // mbsd with a span (LLaDA's default) decodes the answer as one block: any length is whole.
    let block = match a.one_block(shared.info.shift_logits) {
        true => None,
        false => Some(
            a.block_length
                .or(shared.checkpoint.block_length)
                .unwrap_or(DEFAULT_BLOCK_LENGTH),
        ),
    };
    let default_gen = a
        .gen_length
        .or(shared.checkpoint.gen_length)
        .unwrap_or(DEFAULT_GEN_LENGTH);
    let round = |n: usize| match block {
        None => Ok(n),
        Some(block) => n
            .div_ceil(block)
            .checked_mul(block)
            .ok_or_else(|| ApiError::field("max_tokens", format!("{n} is too large"))),
    };
    match req.max_tokens {
        Some(m) => {
            if m > shared.limits.max_tokens {
                return Err(ApiError::field(
                    "max_tokens",
                    format!(
                        "{m} exceeds this server's limit of {} (--max-tokens-limit)",
                        shared.limits.max_tokens
                    ),
                ));
            }
            a.gen_length = Some(round(m)?);
            a.block_length = a.block_length.or(block);
        }
        None if block.is_some_and(|b| !default_gen.is_multiple_of(b)) => {
            a.gen_length = Some(round(default_gen)?);
            a.block_length = block;
        }
        None => {}
    }
    Ok(a)
}

/// The prompt and the generated positions must fit the model's context.
fn check_context(
    info: &ModelInfo,
    req: &GenRequest,
    prompt_len: usize,
    gen_length: usize,
) -> Result<(), ApiError> {
    let pf = prompt_field(req.endpoint);
    if prompt_len >= info.max_seq_len {
        return Err(ApiError::field(
            pf,
            format!(
                "the prompt has {prompt_len} tokens; the model's context is {} tokens",
                info.max_seq_len
            ),
        )
        .with_code("context_length_exceeded"));
    }
    let total = prompt_len.saturating_add(gen_length);
    if total > info.max_seq_len {
        let field = if req.max_tokens.is_some() {
            "max_tokens"
        } else {
            pf
        };
        return Err(ApiError::field(
            field,
            format!(
                "the prompt ({prompt_len} tokens) + max_tokens rounded up to whole blocks \
                 ({gen_length}) = {total} exceeds the model's context of {} tokens",
                info.max_seq_len
            ),
        )
        .with_code("context_length_exceeded"));
    }
    Ok(())
}

/// Holds back text that may be the start of a stop string, and cuts the text at the first one.
struct StopStrings {
    stops: Vec<String>,
    text: String,
    emitted: usize,
    hit: bool,
}

impl StopStrings {
    fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            text: String::new(),
            emitted: 0,
            hit: false,
        }
    }

    /// Add final text; returns what may be shown now.
    fn push(&mut self, delta: &str) -> String {
        if self.hit {
            return String::new();
        }
        self.text.push_str(delta);
        if let Some(p) = self.stops.iter().filter_map(|s| self.text.find(s)).min() {
            self.hit = true;
            let out = self.text[self.emitted.min(p)..p].to_string();
            self.emitted = p;
            self.text.truncate(p);
            return out;
        }
        let mut hold = 0;
        for s in &self.stops {
            for k in (1..s.len()).rev() {
                if s.is_char_boundary(k) && self.text.ends_with(&s[..k]) {
                    hold = hold.max(k);
                    break;
                }
            }
        }
        let safe = (self.text.len() - hold).max(self.emitted);
        let out = self.text[self.emitted..safe].to_string();
        self.emitted = safe;
        out
    }

    /// The text is complete: release what was held back.
    fn finish(&mut self, delta: &str) -> String {
        let mut out = self.push(delta);
        if !self.hit {
            out.push_str(&self.text[self.emitted..]);
            self.emitted = self.text.len();
        }
        out
    }
}

fn state_name(s: TokenState, masked: bool, tentative: bool) -> &'static str {
    match s {
        TokenState::Stable => "stable",
        TokenState::Visible => "visible",
        TokenState::Invisible if masked && !tentative => "masked",
        TokenState::Invisible => "invisible",
    }
}

/// Turns a token sequence into text (the tokenizer's, or `<id>` pieces without one).
type Detokenize = Box<dyn FnMut(&[u32]) -> Result<String, String> + Send>;

/// A request's decoding state beside its generation, kept by the engine: the final text as it
/// grows, the stop strings, the canvas pieces, and the channel its [`Event`]s go to.
pub struct Session {
    pub job: Prepared,
    tokenizer: Option<Arc<TextTokenizer>>,
    stop_ids: Vec<u32>,
    text: FinalTextStream<Detokenize>,
    stops: StopStrings,
    pieces: HashMap<u32, String>,
    events: UnboundedSender<Event>,
    /// The request's handler is gone (its end of the channel was dropped).
    gone: bool,
    /// When decoding started (the sequence got its slot).
    t0: Instant,
}

impl Session {
    pub fn new(shared: &Shared, job: Prepared, events: UnboundedSender<Event>) -> Self {
        let tok = shared.tokenizer.clone();
        let t = tok.clone();
        let decode: Detokenize = Box::new(move |ids: &[u32]| match &t {
            Some(t) => t.decode(ids, true).map_err(|e| e.to_string()),
            // No tokenizer: the text is the ids.
            None => Ok(ids.iter().map(|i| format!("<{i}>")).collect()),
        });
        let stop_ids = shared.info.special.stop_ids();
        Self {
            stops: StopStrings::new(job.stop.clone()),
            job,
            tokenizer: tok,
            text: FinalTextStream::new(decode, stop_ids.clone()),
            stop_ids,
            pieces: HashMap::new(),
            events,
            gone: false,
            t0: Instant::now(),
        }
    }

    /// Decoding starts now (the request got a sequence slot): `elapsed_ms` and the canvas's
    /// tokens/s count from here.
    pub fn start_clock(&mut self) {
        self.t0 = Instant::now();
    }

    /// Send an event to the request's handler; a handler that is gone marks the session
    /// [`Session::gone`].
    pub fn send(&mut self, e: Event) {
        if self.events.send(e).is_err() {
            self.gone = true;
        }
    }

    /// Whether the request's handler went away (the client disconnected).
    pub fn gone(&self) -> bool {
        self.gone || self.events.is_closed()
    }

    /// Completion tokens final so far.
    pub fn tokens(&self) -> usize {
        self.text.tokens().len()
    }

    /// One step of the generation: send the text that became final (held back where it may start
    /// a stop string) and, with `canvas`, the canvas. Returns whether the answer is complete — a
    /// stop string, or a stop id in the final prefix: nothing after it could change the answer.
    pub fn step(&mut self, e: &StepEvent<'_>) -> Result<bool, ApiError> {
        let delta = self
            .text
            .step(e)
            .map_err(|m| ApiError::server(format!("detokenizing: {m}")))?;
        let shown = self.stops.push(&delta);
        let canvas = self
            .job
            .canvas
            .then(|| canvas_json(e, &self.tokenizer, &mut self.pieces, self.t0));
        if !shown.is_empty() || canvas.is_some() {
            self.send(Event::Step {
                delta: shown,
                canvas,
            });
        }
        Ok(self.stops.hit || self.text.ended())
    }

    /// The last event of a generation that ended (ran out of positions, or stopped by
    /// [`Session::step`]): the rest of the text and the summary.
    pub fn finish(&mut self, g: &Outcome) -> Result<Event, ApiError> {
        let elapsed = self.t0.elapsed().as_secs_f64();
        let p = self.job.params;
        let hit_string = self.stops.hit;
        let delta = if hit_string {
            String::new()
        } else {
            let rest = self
                .text
                .finish(g.generated())
                .map_err(|m| ApiError::server(format!("detokenizing: {m}")))?;
            self.stops.finish(&rest)
        };
        let hit_id = g.generated().iter().any(|t| self.stop_ids.contains(t));
        let completion_tokens = self.text.tokens().len();
        let diffusion = json!({
            "max_tokens_requested": self.job.max_tokens,
            "gen_length": p.gen_length,
            "block_length": p.block_length,
            "steps": p.steps,
            "strategy": p.strategy.name(),
            "threshold": p.decide.threshold(),
            "temperature": p.temperature,
            "seed": p.seed,
            "forwards": g.forwards,
            "steps_run": g.steps,
            "elapsed_ms": elapsed * 1e3,
            "tokens_per_second": completion_tokens as f64 / elapsed.max(1e-9),
        });
        Ok(Event::Done {
            delta,
            summary: Summary {
                finish_reason: if hit_string || hit_id {
                    "stop"
                } else {
                    "length"
                },
                prompt_tokens: self.job.prompt_ids.len(),
                completion_tokens,
                diffusion,
            },
        })
    }
}

/// The canvas of a step for the live view: each generated position's text and state (`masked`,
/// `invisible`: a prediction not yet decided, `visible`: decided but revisable, `stable`: final).
fn canvas_json(
    e: &StepEvent<'_>,
    tok: &Option<Arc<TextTokenizer>>,
    pieces: &mut HashMap<u32, String>,
    t0: Instant,
) -> Value {
    let tentative: HashMap<usize, u32> = e.tentative.iter().copied().collect();
    let mut piece = |id: u32| -> String {
        pieces
            .entry(id)
            .or_insert_with(|| match tok {
                // Whitespace shows: a piece that decodes to nothing (a lone space the decoder
                // strips) or to blanks is drawn as ␣ (space), ↵ (newline), ⇥ (tab).
                Some(t) => match t.decode(&[id], false) {
                    Ok(p) if p.is_empty() => "\u{2423}".to_string(),
                    Ok(p) if p.trim().is_empty() => p
                        .chars()
                        .map(|c| match c {
                            '\n' => '\u{21b5}',
                            '\t' => '\u{21e5}',
                            _ => '\u{2423}',
                        })
                        .collect(),
                    Ok(p) => p,
                    Err(_) => format!("<{id}>"),
                },
                None => format!("<{id}>"),
            })
            .clone()
    };
    let n = e.canvas.len() - e.prompt_len;
    let mut tokens = Vec::with_capacity(n);
    let mut states = Vec::with_capacity(n);
    for k in e.prompt_len..e.canvas.len() {
        let masked = e.canvas[k] == e.mask_id;
        let guess = tentative.get(&k).copied();
        let state = e.states.get(k).copied().unwrap_or(TokenState::Invisible);
        states.push(state_name(state, masked, guess.is_some()));
        tokens.push(match (masked, guess) {
            (false, _) => piece(e.canvas[k]),
            (true, Some(g)) => piece(g),
            (true, None) => String::new(),
        });
    }
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    let decided = n - e.masked_left.min(n);
    json!({
        "step": e.step,
        "block": e.block,
        "num_blocks": e.num_blocks,
        "forwards": e.forwards,
        "final_len": e.final_len,
        "masked_left": e.masked_left,
        "elapsed_ms": secs * 1e3,
        "tokens_per_second": decided as f64 / secs,
        "tokens": tokens,
        "states": states,
    })
}

#[cfg(test)]
mod tests {
    use super::StopStrings;

    #[test]
    fn stop_strings_cut_the_text_and_hold_back_prefixes() {
        let mut s = StopStrings::new(vec!["Answer".into(), "\n\n".into()]);
        let mut out = String::new();
        for d in ["23 + 5", " = 28. An", "sw", "er: 28"] {
            out.push_str(&s.push(d));
            assert!(!out.contains("An"), "{out:?}");
        }
        assert!(s.hit);
        assert_eq!(out, "23 + 5 = 28. ");
        assert_eq!(s.finish("more"), "");
        // Held text that turns out not to be a stop string is released.
        let mut s = StopStrings::new(vec!["xyz".into()]);
        assert_eq!(s.push("abx"), "ab");
        assert_eq!(s.push("y!"), "xy!");
        assert_eq!(s.push("xy"), "");
        assert_eq!(s.finish(""), "xy");
        // No stop strings: everything at once.
        let mut s = StopStrings::new(vec![]);
        assert_eq!(s.push("héllo"), "héllo");
    }
}
