//! The HTTP side of `essim replay`: one pooled hyper client (TCP_NODELAY),
//! the reachability probe, and one streamed request read chunk by chunk
//! with the client-side times of its first and last token.

use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use engine_state_router::{ENGINE_HEADER, SESSION_HEADER};
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use tokio::time::Instant;

/// The pooled client.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// How long the probe of each URL may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// A client with a connection pool and TCP_NODELAY.
pub fn client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(PROBE_TIMEOUT));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .build(connector)
}

/// A `--url` without its trailing slash, checked to be `http://HOST:PORT[/PATH]`.
pub fn base_url(url: &str) -> anyhow::Result<String> {
    let uri: hyper::Uri = url
        .parse()
        .with_context(|| format!("--url {url:?}: not a URL"))?;
    anyhow::ensure!(
        uri.scheme_str() == Some("http") && uri.authority().is_some(),
        "--url {url:?}: an http://HOST:PORT URL is needed (no TLS)"
    );
    Ok(url.trim_end_matches('/').to_owned())
}

/// The error and its causes, as one line (the OS error last): anyhow's
/// alternate form.
fn chain(e: impl std::error::Error + Send + Sync + 'static) -> String {
    format!("{:#}", anyhow::Error::new(e))
}

/// `GET /v1/models` (or, if that is refused, `/health`) must answer 2xx.
pub async fn probe(client: &HttpClient, base: &str) -> anyhow::Result<()> {
    let mut last = None;
    for path in ["/v1/models", "/health"] {
        let request = Request::get(format!("{base}{path}"))
            .body(Full::new(Bytes::new()))
            .context("a probe request")?;
        let response = tokio::time::timeout(PROBE_TIMEOUT, client.request(request))
            .await
            .map_err(|_| {
                anyhow::anyhow!("{base}: no answer to GET {path} within {PROBE_TIMEOUT:?}")
            })?
            .map_err(|e| anyhow::anyhow!("{base} is unreachable: {}", chain(e)))?;
        let status = response.status();
        // Drain the body so that the connection returns to the pool.
        let _ = response.into_body().collect().await;
        if status.is_success() {
            return Ok(());
        }
        last = Some((path, status));
    }
    let (path, status) = last.expect("two probes");
    anyhow::bail!("{base}: GET {path} answered {status} (and /v1/models did not answer 2xx)")
}

/// How one request ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Streamed to `[DONE]`.
    Ok,
    /// The server answered this status.
    Http(u16),
    /// Connection or protocol error, or a stream cut short.
    Error(String),
    /// Past `--timeout-s`.
    Timeout,
    /// Not sent: `--max-in-flight` requests were in flight.
    Skipped,
}

impl Outcome {
    /// Its CSV / summary name: `ok`, `http_<code>`, `error`, `timeout`, `skipped`.
    pub fn name(&self) -> String {
        match self {
            Outcome::Ok => "ok".to_owned(),
            Outcome::Http(code) => format!("http_{code}"),
            Outcome::Error(_) => "error".to_owned(),
            Outcome::Timeout => "timeout".to_owned(),
            Outcome::Skipped => "skipped".to_owned(),
        }
    }
}

/// What the client saw of one request (wall times from its send).
#[derive(Clone, Debug)]
pub struct Response {
    /// How it ended.
    pub outcome: Outcome,
    /// The `x-esroute-engine` header, if any.
    pub engine: String,
    /// First token (the first chunk with text).
    pub first_token: Option<Duration>,
    /// Last token.
    pub last_token: Option<Duration>,
    /// The end of the stream.
    pub end: Option<Duration>,
    /// From `usage`.
    pub prompt_tokens: Option<u64>,
    /// From `usage`.
    pub completion_tokens: Option<u64>,
    /// The generated text.
    pub text: String,
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Choice {
    text: Option<String>,
    delta: Option<Delta>,
}

#[derive(Deserialize)]
struct Delta {
    content: Option<String>,
}

#[derive(Deserialize)]
struct Usage {
    prompt_tokens: u64,
    completion_tokens: u64,
}

/// Send one request (`body` to `url`, with the session header if any) and
/// read its SSE stream to the end. `sent`: when it was sent; the caller
/// bounds the whole call with its timeout.
pub async fn send(
    client: &HttpClient,
    url: &str,
    body: Vec<u8>,
    session: Option<&str>,
    sent: &mut Option<Instant>,
) -> Response {
    let mut response = Response {
        outcome: Outcome::Ok,
        engine: String::new(),
        first_token: None,
        last_token: None,
        end: None,
        prompt_tokens: None,
        completion_tokens: None,
        text: String::new(),
    };
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(url)
        .header(hyper::header::CONTENT_TYPE, "application/json");
    if let Some(session) = session {
        request = request.header(SESSION_HEADER, session);
    }
    let request = match request.body(Full::new(Bytes::from(body))) {
        Ok(request) => request,
        Err(e) => {
            response.outcome = Outcome::Error(e.to_string());
            return response;
        }
    };
    let start = Instant::now();
    *sent = Some(start);
    let answer = match client.request(request).await {
        Ok(answer) => answer,
        Err(e) => {
            response.outcome = Outcome::Error(chain(e));
            return response;
        }
    };
    if let Some(engine) = answer
        .headers()
        .get(ENGINE_HEADER)
        .and_then(|v| v.to_str().ok())
    {
        response.engine = engine.to_owned();
    }
    let status = answer.status();
    let mut body = answer.into_body();
    if status != StatusCode::OK {
        let _ = body.collect().await;
        response.outcome = Outcome::Http(status.as_u16());
        return response;
    }
    let mut buffer: Vec<u8> = Vec::new();
    let mut done = false;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => {
                response.outcome = Outcome::Error(chain(e));
                return response;
            }
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        let now = start.elapsed();
        buffer.extend_from_slice(&data);
        // Whole events only: `data: …` lines ended by a blank line.
        while let Some(end) = find_event_end(&buffer) {
            let event: Vec<u8> = buffer.drain(..end).collect();
            for line in event.split(|&b| b == b'\n') {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                let Some(data) = line.strip_prefix(b"data:") else {
                    continue;
                };
                let data = data.trim_ascii();
                if data == b"[DONE]" {
                    done = true;
                    continue;
                }
                let chunk: Chunk = match serde_json::from_slice(data) {
                    Ok(chunk) => chunk,
                    Err(e) => {
                        response.outcome = Outcome::Error(format!("a bad stream chunk: {e}"));
                        return response;
                    }
                };
                for choice in chunk.choices {
                    let text = choice.text.or(choice.delta.and_then(|d| d.content));
                    if let Some(text) = text.filter(|t| !t.is_empty()) {
                        response.first_token.get_or_insert(now);
                        response.last_token = Some(now);
                        response.text.push_str(&text);
                    }
                }
                if let Some(usage) = chunk.usage {
                    response.prompt_tokens = Some(usage.prompt_tokens);
                    response.completion_tokens = Some(usage.completion_tokens);
                }
            }
        }
    }
    response.end = Some(start.elapsed());
    if !done {
        response.outcome = Outcome::Error("the stream ended without [DONE]".to_owned());
    }
    response
}

/// The end (past the blank line) of the first whole SSE event in `buffer`.
fn find_event_end(buffer: &[u8]) -> Option<usize> {
    let lf = buffer.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    let crlf = buffer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_end_at_blank_lines_and_urls_are_checked() {
        assert_eq!(find_event_end(b"data: x\n\ndata: y"), Some(9));
        assert_eq!(find_event_end(b"data: x\r\n\r\n"), Some(11));
        assert_eq!(find_event_end(b"data: x\n"), None);
        assert_eq!(
            base_url("http://127.0.0.1:8100/").unwrap(),
            "http://127.0.0.1:8100"
        );
        assert!(base_url("https://example.com").is_err());
        assert!(base_url("localhost:80").is_err());
        assert_eq!(Outcome::Http(503).name(), "http_503");
    }
}
