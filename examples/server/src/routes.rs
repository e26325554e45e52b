//! The HTTP side: routes, handing requests to the engine (which admits them or answers 429),
//! responses, SSE streams, `/health` and `/metrics`.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::engine::{Cancel, Request};
use crate::error::ApiError;
use crate::guard::{self, Access};
use crate::request::{self, Endpoint};
use crate::session::{self, Event, Prepared, Session, Shared, Summary};

/// The page at `/` (one static file, no build step).
const INDEX_HTML: &str = include_str!("../static/index.html");

#[derive(Clone)]
pub struct App {
    pub shared: Arc<Shared>,
    /// How long a request's body may take to arrive after its head (`--header-timeout`).
    pub body_timeout: Duration,
}

/// The routes, behind the access checks of `guard` (Host, Origin, API key).
pub fn router(app: App, access: Arc<Access>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .fallback(not_found)
        .with_state(app)
        .layer(axum::middleware::from_fn_with_state(access, guard::check))
}

async fn index() -> Html<&'static str> {
    Html(INDEX_HTML)
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!(
        "no route {uri}; this server has GET /, GET /health, GET /metrics, GET /v1/models, \
         POST /v1/completions, POST /v1/chat/completions"
    ))
}

async fn health(State(app): State<App>) -> Json<Value> {
    let s = &app.shared;
    let e = &s.stats;
    let l = &s.limits;
    Json(json!({
        "status": "ok",
        "model": s.model_id,
        "running_sequences": e.running.load(Ordering::SeqCst),
        "waiting_sequences": e.waiting.load(Ordering::SeqCst),
        "live_sequences": e.live.load(Ordering::SeqCst),
        "requests_started": e.started.load(Ordering::Relaxed),
        "requests_completed": e.completed.load(Ordering::Relaxed),
        "requests_cancelled": e.cancelled.load(Ordering::Relaxed),
        "requests_failed": e.failed.load(Ordering::Relaxed),
        "requests_rejected_queue_full": e.rejected_queue_full.load(Ordering::Relaxed),
        "forwards": e.forwards.load(Ordering::Relaxed),
        "batched_forwards": e.batched_forwards.load(Ordering::Relaxed),
        "forward_sequences": e.forward_sequences.load(Ordering::Relaxed),
        "tokens_per_second": e.tokens_per_second(),
        "limits": {
            "max_sequences": l.max_sequences,
            "max_queue": l.max_queue,
            "max_batch_rows": l.max_batch_rows,
            "max_body_bytes": l.max_body_bytes,
            "max_tokens": l.max_tokens,
            "timeout_secs": l.timeout_secs,
        },
        "defaults": {
            "strategy": s.decode.strategy,
            "max_context": s.info.max_seq_len,
        },
    }))
}

/// The Prometheus text exposition of the engine's gauges and counters.
async fn metrics(State(app): State<App>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        app.shared.stats.prometheus(),
    )
        .into_response()
}

async fn models(State(app): State<App>) -> Json<Value> {
    let s = &app.shared;
    Json(json!({
        "object": "list",
        "data": [{
            "id": s.model_id,
            "object": "model",
            "created": s.created,
            "owned_by": "llada-rs",
            "max_model_len": s.info.max_seq_len,
        }],
    }))
}

async fn completions(State(app): State<App>, headers: HeaderMap, body: Body) -> Response {
    generate(app, Endpoint::Completions, &headers, body).await
}

async fn chat_completions(State(app): State<App>, headers: HeaderMap, body: Body) -> Response {
    generate(app, Endpoint::Chat, &headers, body).await
}

/// Bodies are JSON: `Content-Type: application/json` (parameters such as `charset` allowed).
/// This also refuses the one body a web page may send cross-site without a preflight
/// (`text/plain`, `application/x-www-form-urlencoded`, `multipart/form-data`).
fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let given = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()));
    let essence = given
        .as_deref()
        .map(|v| v.split(';').next().unwrap_or("").trim());
    if essence.is_some_and(|e| e.eq_ignore_ascii_case("application/json")) {
        return Ok(());
    }
    let what = match &given {
        Some(v) => format!("Content-Type `{v}` is not supported"),
        None => "the request has no Content-Type".to_string(),
    };
    Err(ApiError::request(format!(
        "{what}: send the body as JSON with Content-Type: application/json"
    ))
    .status(StatusCode::UNSUPPORTED_MEDIA_TYPE)
    .with_code("unsupported_media_type"))
}

/// Read the body, at most `limit` bytes, within `within` (then 408 and the connection closed).
async fn read_body(
    body: Body,
    limit: usize,
    within: Duration,
) -> Result<axum::body::Bytes, ApiError> {
    let Ok(read) = tokio::time::timeout(within, axum::body::to_bytes(body, limit)).await else {
        return Err(ApiError::request(format!(
            "the request body did not arrive within {} s of its head (--header-timeout)",
            within.as_secs_f64()
        ))
        .status(StatusCode::REQUEST_TIMEOUT)
        .with_code("request_timeout"));
    };
    read.map_err(|e| {
        let mut src: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(s) = src {
            if s.is::<http_body_util::LengthLimitError>() {
                return ApiError::request(format!(
                    "the request body is larger than this server's limit of {limit} bytes \
                     (--max-body-bytes)"
                ))
                .status(StatusCode::PAYLOAD_TOO_LARGE)
                .with_code("body_too_large");
            }
            src = s.source();
        }
        ApiError::request(format!("could not read the request body: {e}"))
    })
}

/// Cancels the request's sequence when dropped before `Guard::finish`: the client went away
/// (hyper drops the response future or the stream).
struct Guard {
    cancel: Arc<Cancel>,
    done: bool,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.done {
            self.cancel.set();
        }
    }
}

async fn generate(app: App, endpoint: Endpoint, headers: &HeaderMap, body: Body) -> Response {
    let r = match check_content_type(headers) {
        Ok(()) => start(app, endpoint, body).await,
        Err(e) => Err(e),
    };
    match r {
        Ok(r) => r,
        // A body that did not arrive in time leaves the connection mid-body: close it.
        Err(e) if e.status != StatusCode::REQUEST_TIMEOUT => e.into_response(),
        Err(e) => {
            let mut r = e.into_response();
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            r
        }
    }
}

async fn start(app: App, endpoint: Endpoint, body: Body) -> Result<Response, ApiError> {
    let shared = app.shared.clone();
    let bytes = read_body(body, shared.limits.max_body_bytes, app.body_timeout).await?;
    let req = request::parse(endpoint, &bytes)?;
    let job = session::prepare(&shared, req)?;
    let cancel = Arc::new(Cancel::default());
    let mut guard = Guard {
        cancel: cancel.clone(),
        done: false,
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let arrived = Instant::now();
    let submitted = shared.engine.submit(Request {
        session: Session::new(&shared, job.clone(), tx),
        cancel,
        arrived,
        deadline: arrived.checked_add(Duration::from_secs_f64(shared.limits.timeout_secs)),
    });
    if let Err(e) = submitted {
        guard.done = true;
        return Err(e);
    }
    // The first event says whether the decoder accepted the parameters (its checks run before
    // any forward), so that a bad request is a 4xx, not an error inside a stream.
    let first = rx
        .recv()
        .await
        .ok_or_else(|| ApiError::server("the engine ended the request without a word"))?;
    if let Event::Failed(e) = first {
        guard.done = true;
        return Err(e);
    }
    let meta = Meta::new(&shared, &job);
    if job.stream {
        let events = stream_events(meta, first, rx, guard, job);
        let sse = Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(10)));
        return Ok(sse.into_response());
    }
    let mut text = String::new();
    let mut ev = first;
    loop {
        match ev {
            Event::Step { delta, .. } => text.push_str(&delta),
            Event::Done { delta, summary } => {
                text.push_str(&delta);
                guard.done = true;
                return Ok(Json(meta.full(&text, &summary)).into_response());
            }
            Event::Failed(e) => {
                guard.done = true;
                return Err(e);
            }
        }
        ev = rx
            .recv()
            .await
            .ok_or_else(|| ApiError::server("the engine ended the request without a word"))?;
    }
}

/// The parts every response object of a request shares.
struct Meta {
    id: String,
    created: u64,
    model: String,
    endpoint: Endpoint,
}

impl Meta {
    fn new(shared: &Shared, job: &Prepared) -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let prefix = match job.endpoint {
            Endpoint::Completions => "cmpl",
            Endpoint::Chat => "chatcmpl",
        };
        Self {
            id: format!("{prefix}-{n}"),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            model: shared.model_id.clone(),
            endpoint: job.endpoint,
        }
    }

    fn usage(s: &Summary) -> Value {
        json!({
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.completion_tokens,
            "total_tokens": s.prompt_tokens + s.completion_tokens,
        })
    }

    /// The whole (non-streamed) response.
    fn full(&self, text: &str, s: &Summary) -> Value {
        match self.endpoint {
            Endpoint::Completions => json!({
                "id": self.id, "object": "text_completion", "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "text": text, "logprobs": null,
                             "finish_reason": s.finish_reason}],
                "usage": Self::usage(s),
                "diffusion": s.diffusion,
            }),
            Endpoint::Chat => json!({
                "id": self.id, "object": "chat.completion", "created": self.created,
                "model": self.model,
                "choices": [{"index": 0,
                             "message": {"role": "assistant", "content": text},
                             "logprobs": null, "finish_reason": s.finish_reason}],
                "usage": Self::usage(s),
                "diffusion": s.diffusion,
            }),
        }
    }

    /// A streamed chunk: a text delta, the first chunk of a chat (`role`), or the last
    /// (`finish_reason`).
    fn chunk(&self, delta: &str, first: bool, finish: Option<&str>) -> Value {
        match self.endpoint {
            Endpoint::Completions => json!({
                "id": self.id, "object": "text_completion", "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "text": delta, "logprobs": null,
                             "finish_reason": finish}],
            }),
            Endpoint::Chat => {
                let d = if first {
                    json!({"role": "assistant", "content": delta})
                } else if finish.is_some() && delta.is_empty() {
                    json!({})
                } else {
                    json!({"content": delta})
                };
                json!({
                    "id": self.id, "object": "chat.completion.chunk", "created": self.created,
                    "model": self.model,
                    "choices": [{"index": 0, "delta": d, "logprobs": null,
                                 "finish_reason": finish}],
                })
            }
        }
    }

    /// The usage chunk of `stream_options.include_usage` (no choices).
    fn usage_chunk(&self, s: &Summary) -> Value {
        let object = match self.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion.chunk",
        };
        json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model,
            "choices": [], "usage": Self::usage(s),
        })
    }
}

fn data(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

/// The SSE stream of a request: chunks of final text (and, with `canvas`, one chunk per step
/// carrying the canvas), the last chunk with `finish_reason` and the `diffusion` summary, the
/// usage chunk when asked for, then `[DONE]`. Dropping the stream (the client went away) cancels
/// the sequence.
fn stream_events(
    meta: Meta,
    first: Event,
    rx: mpsc::UnboundedReceiver<Event>,
    guard: Guard,
    job: Prepared,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    struct St {
        meta: Meta,
        pending: Option<Event>,
        rx: mpsc::UnboundedReceiver<Event>,
        guard: Guard,
        sent_first: bool,
        finished: bool,
        include_usage: bool,
    }
    let st = St {
        meta,
        pending: Some(first),
        rx,
        guard,
        sent_first: false,
        finished: false,
        include_usage: job.include_usage,
    };
    stream::unfold(st, |mut st| async move {
        if st.finished {
            return None;
        }
        let ev = match st.pending.take() {
            Some(e) => e,
            None => match st.rx.recv().await {
                Some(e) => e,
                None => {
                    st.finished = true;
                    let e = ApiError::server("the engine ended the request without a word");
                    return Some((vec![Ok(data(&e.body()))], st));
                }
            },
        };
        let first = !st.sent_first;
        st.sent_first = true;
        let out: Vec<Result<SseEvent, Infallible>> = match ev {
            Event::Step { delta, canvas } => {
                let mut c = st.meta.chunk(&delta, first, None);
                if let Some(cv) = canvas {
                    c["canvas"] = cv;
                }
                vec![Ok(data(&c))]
            }
            Event::Done { delta, summary } => {
                st.finished = true;
                st.guard.done = true;
                let mut v = Vec::new();
                if first && !delta.is_empty() {
                    v.push(Ok(data(&st.meta.chunk("", true, None))));
                }
                let mut last = st.meta.chunk(
                    &delta,
                    first && delta.is_empty(),
                    Some(summary.finish_reason),
                );
                last["diffusion"] = summary.diffusion.clone();
                v.push(Ok(data(&last)));
                if st.include_usage {
                    v.push(Ok(data(&st.meta.usage_chunk(&summary))));
                }
                v.push(Ok(SseEvent::default().data("[DONE]")));
                v
            }
            Event::Failed(e) => {
                st.finished = true;
                st.guard.done = true;
                vec![Ok(data(&e.body()))]
            }
        };
        Some((out, st))
    })
    .flat_map(stream::iter)
}
