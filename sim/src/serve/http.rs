//! The HTTP side of one served engine: the subset of vLLM's OpenAI API that
//! routers and benchmarks use (`/v1/completions`, `/v1/chat/completions`,
//! `/v1/models`, `/health`, `/metrics`, and the render endpoints
//! `/v1/completions/render` and `/v1/chat/completions/render` that
//! vllm-router's cache_aware policy asks for a prompt's token ids). Every
//! generation request becomes a
//! [`Command::Add`] to the engine thread; its tokens come back one
//! [`Sampled`] at a time. A client that goes away (its response body or
//! handler dropped) aborts its request in the model.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::engine_loop::{lock, Command, Gauges, Sampled};
use super::tokens::{self, Message};
use crate::engine::EngineRequest;
use crate::profile::KV_BLOCK_TOKENS;

/// vLLM's default `max_tokens` for a completion that names none.
pub const DEFAULT_MAX_TOKENS: u64 = 16;

/// One engine's HTTP state.
#[derive(Debug)]
pub struct EngineHttp {
    /// `sim-<i>`.
    pub engine_id: String,
    /// Its index (the `engine` label of `/metrics`).
    pub index: usize,
    /// The served model name.
    pub model: String,
    /// KV blocks of the engine: a request needing more is refused (400).
    pub kv_blocks: u64,
    /// To the engine thread.
    pub commands: Sender<Command>,
    /// What `/metrics` shows.
    pub gauges: Arc<Mutex<Gauges>>,
    /// The next request id.
    pub next_id: AtomicU64,
}

/// The routes of one engine.
pub fn router(state: Arc<EngineHttp>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions/render", post(completions_render))
        .route("/v1/chat/completions/render", post(chat_completions_render))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .with_state(state)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let body = json!({"object": "error", "message": message.into(),
        "type": "BadRequestError", "code": status.as_u16()});
    (status, axum::Json(body)).into_response()
}

fn created() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Completion,
    Chat,
}

/// A parsed request: prompt tokens and the generation options.
struct Parsed {
    prompt: Vec<u32>,
    max_tokens: u64,
    stream: bool,
    include_usage: bool,
    model: String,
    /// `stream_options` as sent (render echoes it).
    stream_options: Value,
}

/// The request, or why it is a bad one (400).
fn parse(body: &[u8], kind: Kind, default_model: &str) -> Result<Parsed, String> {
    let bad = |m: String| m;
    let value: Value =
        serde_json::from_slice(body).map_err(|e| bad(format!("invalid JSON body: {e}")))?;
    let prompt = match kind {
        Kind::Completion => match value.get("prompt") {
            Some(Value::String(text)) => tokens::text_tokens(text),
            Some(Value::Array(items)) => items
                .iter()
                .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| {
                    bad("prompt: a string or one list of token ids (u32); batches are not supported".into())
                })?,
            _ => return Err(bad("prompt: a string or a list of token ids is required".into())),
        },
        Kind::Chat => {
            let messages: Vec<Message> = value
                .get("messages")
                .cloned()
                .map(serde_json::from_value)
                .ok_or_else(|| bad("messages: required".into()))?
                .map_err(|e| bad(format!("messages: {e} (string contents only)")))?;
            tokens::text_tokens(&tokens::chat_text(&messages))
        }
    };
    if prompt.is_empty() {
        return Err(bad("the prompt is empty".into()));
    }
    let max_tokens = match value
        .get("max_tokens")
        .or_else(|| value.get("max_completion_tokens"))
    {
        None | Some(Value::Null) => DEFAULT_MAX_TOKENS,
        Some(v) => v
            .as_u64()
            .filter(|&n| n >= 1)
            .ok_or_else(|| bad("max_tokens: a whole number ≥ 1".into()))?,
    };
    let stream = value
        .get("stream")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let include_usage = value
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let model = value
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(default_model)
        .to_owned();
    let stream_options = value.get("stream_options").cloned().unwrap_or(Value::Null);
    Ok(Parsed {
        prompt,
        max_tokens,
        stream,
        include_usage,
        model,
        stream_options,
    })
}

/// Aborts its request in the model when dropped before the last token.
struct AbortGuard {
    id: u64,
    commands: Sender<Command>,
    done: bool,
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.commands.send(Command::Abort(self.id));
        }
    }
}

async fn completions(State(state): State<Arc<EngineHttp>>, body: Bytes) -> Response {
    serve(state, &body, Kind::Completion).await
}

async fn chat_completions(State(state): State<Arc<EngineHttp>>, body: Bytes) -> Response {
    serve(state, &body, Kind::Chat).await
}

async fn completions_render(State(state): State<Arc<EngineHttp>>, body: Bytes) -> Response {
    render(&state, &body, Kind::Completion)
}

async fn chat_completions_render(State(state): State<Arc<EngineHttp>>, body: Bytes) -> Response {
    render(&state, &body, Kind::Chat)
}

/// The request, parsed and within the engine's context, or why not (400).
fn admit(state: &EngineHttp, body: &[u8], kind: Kind) -> Result<Parsed, String> {
    let parsed = parse(body, kind, &state.model)?;
    let total = parsed.prompt.len() as u64 + parsed.max_tokens;
    if total.div_ceil(KV_BLOCK_TOKENS) > state.kv_blocks {
        return Err(format!(
            "This model's maximum context length is {} tokens. However, you requested {} \
             tokens ({} in the messages, {} in the completion).",
            state.kv_blocks * KV_BLOCK_TOKENS,
            total,
            parsed.prompt.len(),
            parsed.max_tokens
        ));
    }
    Ok(parsed)
}

/// vLLM's render endpoints (`vllm/entrypoints/scale_out/render`): the
/// token-in `GenerateRequest` the request would become, without generating.
/// A completion renders to a list of them (one per prompt; essim takes one
/// prompt), a chat to one. The token ids are the ones the engine itself
/// would run ([`parse`]); `sampling_params` holds `max_tokens` only (vLLM
/// writes out every sampling field).
fn render(state: &EngineHttp, body: &[u8], kind: Kind) -> Response {
    let parsed = match admit(state, body, kind) {
        Ok(parsed) => parsed,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let id = state.next_id.fetch_add(1, Ordering::Relaxed);
    let request = json!({
        "request_id": format!("{}-{}-{id}", kind.prefix(), state.engine_id),
        "token_ids": parsed.prompt,
        "token_offsets": null,
        "features": null,
        "sampling_params": {"max_tokens": parsed.max_tokens},
        "model": parsed.model,
        "stream": parsed.stream,
        "stream_options": parsed.stream_options,
        "cache_salt": null,
        "priority": 0,
        "kv_transfer_params": null,
    });
    axum::Json(match kind {
        Kind::Completion => json!([request]),
        Kind::Chat => request,
    })
    .into_response()
}

async fn serve(state: Arc<EngineHttp>, body: &[u8], kind: Kind) -> Response {
    let parsed = match admit(&state, body, kind) {
        Ok(parsed) => parsed,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let id = state.next_id.fetch_add(1, Ordering::Relaxed);
    let seed = tokens::output_seed(&parsed.prompt);
    // The output is known in advance: the engine caches its blocks under
    // their real hashes, as vLLM does.
    let mut all = parsed.prompt.clone();
    all.extend(tokens::output_tokens(seed, parsed.max_tokens));
    let request = EngineRequest {
        id,
        prompt_len: parsed.prompt.len() as u64,
        output_len: parsed.max_tokens,
        block_hashes: tokens::kv_block_hashes(&all),
        router_block_hashes: tokens::router_block_hashes(&all),
    };
    let (events, receiver) = unbounded_channel();
    let commands = state.commands.clone();
    if commands.send(Command::Add { request, events }).is_err() {
        return error(StatusCode::SERVICE_UNAVAILABLE, "the engine has stopped");
    }
    let guard = AbortGuard {
        id,
        commands,
        done: false,
    };
    let out = Output {
        id: format!("{}-{}-{id}", kind.prefix(), state.engine_id),
        kind,
        model: parsed.model,
        created: created(),
        seed,
        prompt_tokens: parsed.prompt.len() as u64,
        include_usage: parsed.include_usage,
    };
    match parsed.stream {
        true => {
            let stream = TokenStream {
                receiver,
                guard,
                out,
                started: false,
                ended: false,
            };
            Response::builder()
                .header(header::CONTENT_TYPE, "text/event-stream")
                .header(header::CACHE_CONTROL, "no-cache")
                .body(Body::from_stream(stream))
                .expect("a valid response")
        }
        false => whole(receiver, guard, out).await,
    }
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::Completion => "cmpl",
            Kind::Chat => "chatcmpl",
        }
    }
}

/// How one request's response is written.
struct Output {
    id: String,
    kind: Kind,
    model: String,
    created: u64,
    seed: u64,
    prompt_tokens: u64,
    include_usage: bool,
}

impl Output {
    fn usage(&self, completion_tokens: u64) -> Value {
        json!({"prompt_tokens": self.prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens})
    }

    fn text(&self, index: u64) -> String {
        char::from(tokens::output_token(self.seed, index)).to_string()
    }

    fn chunk(&self, choices: Value) -> Value {
        let object = match self.kind {
            Kind::Completion => "text_completion",
            Kind::Chat => "chat.completion.chunk",
        };
        json!({"id": self.id, "object": object, "created": self.created,
            "model": self.model, "choices": choices})
    }

    /// The chunk of one sampled token.
    fn token_chunk(&self, sampled: Sampled) -> Value {
        let finish = sampled.last.then_some("length");
        let text = self.text(sampled.index);
        self.chunk(match self.kind {
            Kind::Completion => json!([{"index": 0, "text": text, "logprobs": null,
                "finish_reason": finish, "stop_reason": null}]),
            Kind::Chat => json!([{"index": 0, "delta": {"content": text}, "logprobs": null,
                "finish_reason": finish, "stop_reason": null}]),
        })
    }

    /// The whole (non-streamed) response.
    fn whole(&self, tokens: u64) -> Value {
        let text: String = (0..tokens).map(|k| self.text(k)).collect();
        let finish = (tokens > 0).then_some("length");
        let (object, choice) = match self.kind {
            Kind::Completion => (
                "text_completion",
                json!({"index": 0, "text": text, "logprobs": null,
                    "finish_reason": finish, "stop_reason": null}),
            ),
            Kind::Chat => (
                "chat.completion",
                json!({"index": 0, "message": {"role": "assistant", "content": text},
                    "logprobs": null, "finish_reason": finish, "stop_reason": null}),
            ),
        };
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model,
            "choices": [choice], "usage": self.usage(tokens)})
    }
}

async fn whole(
    mut receiver: UnboundedReceiver<Sampled>,
    mut guard: AbortGuard,
    out: Output,
) -> Response {
    let mut tokens = 0;
    while let Some(sampled) = receiver.recv().await {
        tokens = sampled.index + 1;
        if sampled.last {
            guard.done = true;
            return axum::Json(out.whole(tokens)).into_response();
        }
    }
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("the engine stopped after {tokens} tokens"),
    )
}

/// The SSE body of a streamed request: `data: {chunk}` per token (a chat
/// stream opens with the assistant role), then a chunk with `usage` and
/// empty choices (unless `stream_options.include_usage` is false), then
/// `data: [DONE]`. Dropped early (the client left): the request is aborted.
struct TokenStream {
    receiver: UnboundedReceiver<Sampled>,
    guard: AbortGuard,
    out: Output,
    started: bool,
    ended: bool,
}

fn event(value: &Value) -> String {
    format!("data: {value}\n\n")
}

impl futures_core::Stream for TokenStream {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        if !this.started && this.out.kind == Kind::Chat {
            this.started = true;
            let role = this.out.chunk(json!([{"index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": null, "finish_reason": null}]));
            return Poll::Ready(Some(Ok(Bytes::from(event(&role)))));
        }
        this.started = true;
        match this.receiver.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                // The engine stopped: end the stream without [DONE].
                this.ended = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(sampled)) => {
                let mut text = event(&this.out.token_chunk(sampled));
                if sampled.last {
                    this.guard.done = true;
                    this.ended = true;
                    if this.out.include_usage {
                        let mut usage = this.out.chunk(json!([]));
                        usage["usage"] = this.out.usage(sampled.index + 1);
                        text.push_str(&event(&usage));
                    }
                    text.push_str("data: [DONE]\n\n");
                }
                Poll::Ready(Some(Ok(Bytes::from(text))))
            }
        }
    }
}

async fn models(State(state): State<Arc<EngineHttp>>) -> Response {
    axum::Json(
        json!({"object": "list", "data": [{"id": state.model, "object": "model",
        "created": created(), "owned_by": "essim", "root": state.model, "parent": null,
        "max_model_len": state.kv_blocks * KV_BLOCK_TOKENS}]}),
    )
    .into_response()
}

async fn health() -> StatusCode {
    StatusCode::OK
}

/// vLLM's own metric names (vLLM 0.33, `vllm/v1/metrics/loggers.py`), in
/// Prometheus text: gauges as they are, counters with `_total`; labels
/// `engine` and `model_name`. `vllm:gpu_cache_usage_perc` (the name before
/// vLLM 0.10) repeats `vllm:kv_cache_usage_perc` for older scrapers.
pub fn metrics_text(state: &EngineHttp) -> String {
    let g = *lock(&state.gauges);
    let labels = format!(
        "{{engine=\"{}\",model_name=\"{}\"}}",
        state.index, state.model
    );
    let mut text = String::new();
    let mut put = |name: &str, kind: &str, help: &str, value: f64, suffix: &str| {
        text.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{suffix}{labels} {value:?}\n"
        ));
    };
    let gauge = "gauge";
    put(
        "vllm:num_requests_running",
        gauge,
        "Number of requests in model execution batches.",
        g.running as f64,
        "",
    );
    put(
        "vllm:num_requests_waiting",
        gauge,
        "Number of requests waiting to be processed.",
        g.waiting as f64,
        "",
    );
    put(
        "vllm:kv_cache_usage_perc",
        gauge,
        "KV-cache usage. 1 means 100 percent usage.",
        g.kv_usage,
        "",
    );
    put(
        "vllm:gpu_cache_usage_perc",
        gauge,
        "KV-cache usage (the name before vLLM 0.10).",
        g.kv_usage,
        "",
    );
    let counter = "counter";
    let total = "_total";
    put(
        "vllm:prefix_cache_queries",
        counter,
        "Prefix cache queries, in terms of number of queried tokens.",
        g.prefix_queries as f64,
        total,
    );
    put(
        "vllm:prefix_cache_hits",
        counter,
        "Prefix cache hits, in terms of number of cached tokens.",
        g.prefix_hits as f64,
        total,
    );
    put(
        "vllm:num_preemptions",
        counter,
        "Cumulative number of preemption from the engine.",
        g.preemptions as f64,
        total,
    );
    put(
        "vllm:prompt_tokens",
        counter,
        "Number of prefill tokens processed.",
        g.prompt_tokens as f64,
        total,
    );
    put(
        "vllm:generation_tokens",
        counter,
        "Number of generation tokens processed.",
        g.generation_tokens as f64,
        total,
    );
    put(
        "vllm:request_success",
        counter,
        "Count of successfully processed requests.",
        g.finished as f64,
        total,
    );
    text
}

async fn metrics(State(state): State<Arc<EngineHttp>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics_text(&state),
    )
        .into_response()
}
