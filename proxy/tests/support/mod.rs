//! Shared by the proxy's tests and its benchmark: a fake engine (an axum
//! server on 127.0.0.1:0 that streams SSE chunks and can be told per
//! request, by fields of the body the proxy forwards unchanged, to fail or
//! stall) and a small HTTP client with `/metrics` readers.
//!
//! The body's fields the fake engine reads: `max_tokens` (the chunks, 4 by
//! default), `fake_first_us` (a pause after the response head, before the
//! first chunk: a prefill), `fake_gap_us` (a pause before every chunk after
//! the first) and `fake`:
//! - `"fail"`: the stream errors (the connection is aborted) before chunk
//!   `fake_fail_at` (2 by default);
//! - `"stall"`: one chunk, then nothing until the client goes away;
//! - `"slow"`: 30 ms between chunks;
//! - `"status500"`: a 500 with an error body, no stream.
#![allow(dead_code)] // each test binary uses its own part

use std::io::{BufRead, BufReader};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use axum::serve::ListenerExt;
use bytes::Bytes;
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio::sync::mpsc;

pub type Http = Client<HttpConnector, Full<Bytes>>;

/// A fake engine's counters.
#[derive(Default)]
pub struct Fake {
    pub requests: AtomicUsize,
    /// Streams whose client (the proxy) went away before the end.
    pub disconnects: AtomicUsize,
    /// Connections accepted.
    pub connections: AtomicUsize,
}

/// A body fed by a channel (no `Stream` adapter needed).
struct ChannelBody(mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|item| item.map(|r| r.map(Frame::data)))
    }
}

/// Streams `max_tokens` chunks, a usage chunk and `[DONE]`, as the module
/// doc says.
async fn fake_completions(State(fake): State<Arc<Fake>>, body: Bytes) -> Response {
    fake.requests.fetch_add(1, Ordering::Relaxed);
    let body: Value = serde_json::from_slice(&body).expect("the proxy forwards JSON");
    let chunks = body["max_tokens"].as_u64().unwrap_or(4);
    let gap = Duration::from_micros(body["fake_gap_us"].as_u64().unwrap_or(0));
    let first = Duration::from_micros(body["fake_first_us"].as_u64().unwrap_or(0));
    let fail_at = body["fake_fail_at"].as_u64().unwrap_or(2);
    let mode = body["fake"].as_str().unwrap_or("").to_owned();
    if mode == "status500" {
        return Response::builder()
            .status(500)
            .header("content-type", "application/json")
            .body(Body::from(r#"{"error":{"message":"fake engine error"}}"#))
            .unwrap();
    }
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        let chunk = |i: u64| {
            Bytes::from(format!(
                "data: {}\n\n",
                json!({"object": "text_completion", "choices": [{"index": 0, "text": format!("t{i}")}]})
            ))
        };
        for i in 0..chunks {
            if mode == "fail" && i == fail_at {
                let _ = tx
                    .send(Err(std::io::Error::other("engine died mid-stream")))
                    .await;
                return;
            }
            let pause = if i == 0 { first } else { gap };
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            if tx.send(Ok(chunk(i))).await.is_err() {
                fake.disconnects.fetch_add(1, Ordering::Relaxed);
                return;
            }
            if mode == "slow" {
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            if mode == "stall" {
                tx.closed().await;
                fake.disconnects.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        let usage =
            json!({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": chunks}});
        let _ = tx.send(Ok(Bytes::from(format!("data: {usage}\n\n")))).await;
        let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::new(ChannelBody(rx)))
        .unwrap()
}

/// Starts a fake engine on a free port of 127.0.0.1; its base URL and counters.
pub async fn start_fake() -> (String, Arc<Fake>) {
    let fake = Arc::new(Fake::default());
    let app = axum::Router::new()
        .route("/v1/completions", axum::routing::post(fake_completions))
        .route(
            "/v1/chat/completions",
            axum::routing::post(fake_completions),
        )
        .route("/health", axum::routing::get(|| async { "ok" }))
        .route(
            "/v1/models",
            axum::routing::get(|| async { r#"{"object":"list","data":[{"id":"fake"}]}"# }),
        )
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    // As a real engine's server would: chunks are not held back by Nagle.
    let counters = fake.clone();
    let listener = listener.tap_io(move |tcp| {
        counters.connections.fetch_add(1, Ordering::Relaxed);
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, fake)
}

/// A pooling HTTP/1 client (TCP_NODELAY set, as the proxy's own).
pub fn client() -> Http {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(connector)
}

/// `POST {url}/v1/completions`.
pub async fn post(http: &Http, url: &str, body: Vec<u8>) -> hyper::Response<hyper::body::Incoming> {
    post_to(http, &format!("{url}/v1/completions"), body).await
}

/// `POST url` with a JSON body.
pub async fn post_to(
    http: &Http,
    url: &str,
    body: Vec<u8>,
) -> hyper::Response<hyper::body::Incoming> {
    let request = hyper::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    http.request(request).await.unwrap()
}

/// `GET url`, the body as text.
pub async fn get_text(http: &Http, url: &str) -> String {
    let request = hyper::Request::get(url)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = http.request(request).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

/// A metric's value from the text exposition (the first sample of the family).
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|line| line.starts_with(name) && !line.starts_with('#'))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

/// The value of the sample whose name and labels are exactly `series`.
pub fn metric_line(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

/// Polls `{proxy_url}/metrics` until the reservations held are zero, or
/// panics at the deadline; the last exposition.
pub async fn reservations_return_to_zero(http: &Http, proxy_url: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = get_text(http, &format!("{proxy_url}/metrics")).await;
        if metric(&text, "esroute_reservations_held") == Some(0.0) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "reservations still held:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A running `esroute` process, killed when dropped.
pub struct Proxy {
    pub child: Child,
    pub url: String,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `esroute --listen 127.0.0.1:0 --engine ID=URL... EXTRA...` and
/// waits for its `esroute listening on ADDR` line.
pub fn start_proxy(engines: &[(&str, &str)], extra: &[&str]) -> Proxy {
    let mut command = Command::new(env!("CARGO_BIN_EXE_esroute"));
    command.args(["--listen", "127.0.0.1:0"]);
    for (id, url) in engines {
        command.arg("--engine").arg(format!("{id}={url}"));
    }
    let mut child = command
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start esroute");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("esroute listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    Proxy {
        child,
        url: format!("http://{addr}"),
    }
}
