//! `esroute` as a real process in front of fake engines (axum servers on
//! 127.0.0.1:0 inside the test) that stream SSE chunks, and can be told per
//! request (the body's `fake` field, forwarded unchanged) to fail
//! mid-stream or to stall.

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

type Http = Client<HttpConnector, Full<Bytes>>;

/// A fake engine's counters.
#[derive(Default)]
struct Fake {
    requests: AtomicUsize,
    /// Streams whose client (the proxy) went away before the end.
    disconnects: AtomicUsize,
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

/// Streams `max_tokens` chunks, a usage chunk and `[DONE]`; `"fake": "fail"`
/// errors after two chunks (the connection is aborted), `"fake": "stall"`
/// sends one chunk and then nothing until the client goes away, `"fake":
/// "late"` sends its first chunk 10 ms after the head.
async fn fake_completions(State(fake): State<Arc<Fake>>, body: Bytes) -> Response {
    fake.requests.fetch_add(1, Ordering::Relaxed);
    let body: Value = serde_json::from_slice(&body).expect("the proxy forwards JSON");
    let chunks = body["max_tokens"].as_u64().unwrap_or(4);
    let mode = body["fake"].as_str().unwrap_or("").to_owned();
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        let chunk = |i: u64| {
            Bytes::from(format!(
                "data: {}\n\n",
                json!({"object": "text_completion", "choices": [{"index": 0, "text": format!("t{i}")}]})
            ))
        };
        if mode == "late" {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for i in 0..chunks {
            if mode == "fail" && i == 2 {
                let _ = tx
                    .send(Err(std::io::Error::other("engine died mid-stream")))
                    .await;
                return;
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

async fn start_fake() -> (String, Arc<Fake>) {
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
    // As vLLM's server does (uvicorn sets TCP_NODELAY).
    let listener = listener.tap_io(|stream| {
        let _ = stream.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, fake)
}

/// A running `esroute`, killed when dropped.
struct Proxy {
    child: Child,
    url: String,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_proxy(engines: &[(&str, &str)], extra: &[&str]) -> Proxy {
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

fn client() -> Http {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

async fn post(http: &Http, url: &str, body: Vec<u8>) -> hyper::Response<hyper::body::Incoming> {
    post_to(http, &format!("{url}/v1/completions"), body).await
}

async fn post_to(http: &Http, url: &str, body: Vec<u8>) -> hyper::Response<hyper::body::Incoming> {
    let request = hyper::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    http.request(request).await.unwrap()
}

async fn get_text(http: &Http, url: &str) -> String {
    let request = hyper::Request::get(url)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = http.request(request).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

/// A metric's value from the text exposition (the first sample of the family).
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|line| line.starts_with(name) && !line.starts_with('#'))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

/// Polls `/metrics` until the reservations held are zero, or panics at the deadline.
async fn reservations_return_to_zero(http: &Http, proxy: &Proxy) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = get_text(http, &format!("{}/metrics", proxy.url)).await;
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

/// 100 streamed requests over two engines: every one gets all its chunks,
/// the usage chunk and `[DONE]`; both engines served; nothing stays reserved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_one_hundred_requests_and_releases_every_reservation() {
    let (url_a, fake_a) = start_fake().await;
    let (url_b, fake_b) = start_fake().await;
    // Engine state is read (an empty directory: shadow counters alone).
    let state = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", state.path().display());
    let proxy = start_proxy(&[("a", &url_a), ("b", &url_b)], &["--uri", &uri]);
    let http = client();
    let mut tasks = Vec::new();
    for i in 0..100u32 {
        let http = http.clone();
        let url = proxy.url.clone();
        tasks.push(tokio::spawn(async move {
            // Sessions of 10 requests, prompts of 600..1600 token ids.
            let prompt: Vec<u32> = (0..600 + i * 10).map(|t| t % 50_000).collect();
            let body = json!({"prompt": prompt, "max_tokens": 5, "stream": true,
                              "session_id": format!("s{}", i % 10)});
            let response = post(&http, &url, serde_json::to_vec(&body).unwrap()).await;
            assert_eq!(response.status(), 200);
            assert!(response.headers().contains_key("x-esroute-engine"));
            let text = response.into_body().collect().await.unwrap().to_bytes();
            let text = String::from_utf8(text.to_vec()).unwrap();
            let events: Vec<&str> = text
                .split("\n\n")
                .filter(|e| !e.is_empty())
                .map(|e| e.strip_prefix("data: ").expect("SSE data lines"))
                .collect();
            assert_eq!(events.len(), 7, "5 chunks, usage, [DONE]: {text}");
            let first: Value = serde_json::from_str(events[0]).unwrap();
            assert_eq!(first["choices"][0]["text"], "t0");
            let usage: Value = serde_json::from_str(events[5]).unwrap();
            assert_eq!(usage["usage"]["completion_tokens"], 5);
            assert_eq!(events[6], "[DONE]");
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let served_a = fake_a.requests.load(Ordering::Relaxed);
    let served_b = fake_b.requests.load(Ordering::Relaxed);
    assert_eq!(served_a + served_b, 100);
    assert!(served_a > 0 && served_b > 0, "a {served_a}, b {served_b}");
    let text = reservations_return_to_zero(&http, &proxy).await;
    let decisions: f64 = text
        .lines()
        .filter(|l| l.starts_with("esroute_decisions_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(decisions, 100.0, "{text}");
    assert!(text.contains("esroute_upstream_first_chunk_seconds_bucket"));
    let health = get_text(&http, &format!("{}/health", proxy.url)).await;
    assert!(health.contains("\"down\":[]"), "{health}");
}

/// An engine failing mid-stream: the client's stream ends in an error (not
/// a clean short answer), the reservation is released, the error counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_failing_mid_stream_fails_the_client_and_releases() {
    let (url, _fake) = start_fake().await;
    let proxy = start_proxy(&[("a", &url)], &["--no-engine-state"]);
    let http = client();
    let body = json!({"prompt": [1, 2, 3], "max_tokens": 5, "fake": "fail"});
    let request = hyper::Request::post(format!("{}/v1/completions", proxy.url))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(&body).unwrap())))
        .unwrap();
    // The connection is aborted: before the head reached the client (the
    // failure came first) or in the body, never a clean end.
    if let Ok(response) = http.request(request).await {
        assert_eq!(response.status(), 200);
        let outcome = response.into_body().collect().await;
        assert!(outcome.is_err(), "the client must see the failure");
    }
    let text = reservations_return_to_zero(&http, &proxy).await;
    assert!(
        text.contains("esroute_upstream_errors_total{engine=\"a\",kind=\"stream\"} 1"),
        "{text}"
    );
}

/// A client that goes away mid-stream: the reservation is released and the
/// engine's stream is closed too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cancel_releases_the_reservation() {
    let (url, fake) = start_fake().await;
    let proxy = start_proxy(&[("a", &url)], &["--no-engine-state"]);
    let http = client();
    let body = json!({"prompt": [1, 2, 3], "max_tokens": 5, "fake": "stall"});
    let response = post(&http, &proxy.url, serde_json::to_vec(&body).unwrap()).await;
    let mut stream = response.into_body();
    let first = stream.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    let held = get_text(&http, &format!("{}/metrics", proxy.url)).await;
    assert_eq!(
        metric(&held, "esroute_reservations_held"),
        Some(1.0),
        "{held}"
    );
    drop(stream);
    reservations_return_to_zero(&http, &proxy).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while fake.disconnects.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "the engine never saw the cancel");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Bad JSON is a 400 with a message, an oversized body a 413, and no
/// reachable engine a 503 naming why; none of them holds a reservation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_json_oversized_and_no_engine_are_refused_clearly() {
    let (url, _fake) = start_fake().await;
    let proxy = start_proxy(
        &[("a", &url), ("gone", "http://127.0.0.1:1")],
        &["--no-engine-state", "--max-body-bytes", "4096"],
    );
    let http = client();
    let response = post(&http, &proxy.url, b"{\"prompt\": [1, 2".to_vec()).await;
    assert_eq!(response.status(), 400);
    let text = response.into_body().collect().await.unwrap().to_bytes();
    let error: Value = serde_json::from_slice(&text).unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not valid JSON"),
        "{error}"
    );
    let big = json!({"prompt": vec![7u32; 4096]});
    let response = post(&http, &proxy.url, serde_json::to_vec(&big).unwrap()).await;
    assert_eq!(response.status(), 413);
    // The unreachable engine is taken out; requests still succeed on "a".
    for _ in 0..4 {
        let body = json!({"prompt": [1, 2, 3], "max_tokens": 1});
        let response = post(&http, &proxy.url, serde_json::to_vec(&body).unwrap()).await;
        assert_eq!(response.status(), 200);
        response.into_body().collect().await.unwrap();
    }
    // Headers are bounded by hyper's defaults (100 headers, ~400 KiB).
    let request = hyper::Request::post(format!("{}/v1/completions", proxy.url))
        .header("x-filler", "f".repeat(512 << 10))
        .body(Full::new(Bytes::from_static(b"{\"prompt\": [1]}")))
        .unwrap();
    match http.request(request).await {
        Ok(response) => assert_eq!(response.status(), 431),
        Err(error) => assert!(!error.is_connect(), "{error}"),
    }
    let health = get_text(&http, &format!("{}/health", proxy.url)).await;
    assert!(health.contains("\"down\":[\"gone\"]"), "{health}");
    reservations_return_to_zero(&http, &proxy).await;

    let dead = start_proxy(&[("gone", "http://127.0.0.1:1")], &["--no-engine-state"]);
    let body = json!({"prompt": [1, 2, 3]});
    let response = post(&http, &dead.url, serde_json::to_vec(&body).unwrap()).await;
    assert_eq!(response.status(), 503);
    let text = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(text.to_vec()).unwrap();
    assert!(
        text.contains("no healthy engine") && text.contains("gone"),
        "{text}"
    );
    reservations_return_to_zero(&http, &dead).await;
}

/// An engine that sends nothing for longer than `--read-timeout-ms`: the
/// client's stream fails, the reservation is released, a timeout counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upstream_times_out_and_releases() {
    let (url, _fake) = start_fake().await;
    let proxy = start_proxy(
        &[("a", &url)],
        &["--no-engine-state", "--read-timeout-ms", "300"],
    );
    let http = client();
    let body = json!({"prompt": [1, 2, 3], "max_tokens": 5, "fake": "stall"});
    let response = post(&http, &proxy.url, serde_json::to_vec(&body).unwrap()).await;
    assert!(response.into_body().collect().await.is_err());
    let text = reservations_return_to_zero(&http, &proxy).await;
    assert!(
        text.contains("esroute_upstream_errors_total{engine=\"a\",kind=\"timeout\"} 1"),
        "{text}"
    );
}

/// `/v1/chat/completions` with text messages and the session in the
/// header; `/v1/models` passed through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completions_are_routed_too() {
    let (url, fake) = start_fake().await;
    let proxy = start_proxy(&[("a", &url)], &["--no-engine-state"]);
    let http = client();
    let body = json!({"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 2});
    let request = hyper::Request::post(format!("{}/v1/chat/completions", proxy.url))
        .header("content-type", "application/json")
        .header("x-session-id", "chat-1")
        .body(Full::new(Bytes::from(serde_json::to_vec(&body).unwrap())))
        .unwrap();
    let response = http.request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let text = response.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&text).ends_with("data: [DONE]\n\n"));
    assert_eq!(fake.requests.load(Ordering::Relaxed), 1);
    let models = get_text(&http, &format!("{}/v1/models", proxy.url)).await;
    assert!(models.contains("\"fake\""), "{models}");
    reservations_return_to_zero(&http, &proxy).await;
}

/// SIGTERM with a stream in flight: the stream still ends with `[DONE]`,
/// then the process exits cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_streams() {
    let (url, _fake) = start_fake().await;
    let mut proxy = start_proxy(&[("a", &url)], &["--no-engine-state"]);
    let http = client();
    let body = json!({"prompt": [1, 2, 3], "max_tokens": 10, "fake": "slow"});
    let response = post(&http, &proxy.url, serde_json::to_vec(&body).unwrap()).await;
    let mut stream = response.into_body();
    assert!(stream.frame().await.unwrap().unwrap().is_data());
    let killed = Command::new("kill")
        .args(["-TERM", &proxy.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let rest = stream
        .collect()
        .await
        .expect("the stream is drained, not cut");
    assert!(String::from_utf8_lossy(&rest.to_bytes()).ends_with("data: [DONE]\n\n"));
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(status) = proxy.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "esroute did not exit after draining"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status}");
}

/// Engine state steers: an engine whose fresh state says it is shutting
/// down gets no requests; when every engine says so, a 503 says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_state_steers_away_from_a_shutting_down_engine() {
    use engine_state_shm_format::{
        monotonic_ns, EngineId, ShmWriter, Snapshot, WriterOptions, FLAG_SHUTTING_DOWN,
    };
    let (url_a, fake_a) = start_fake().await;
    let (url_b, _fake_b) = start_fake().await;
    let dir = tempfile::tempdir().unwrap();
    let snapshot = |flags| Snapshot {
        captured_mono_ns: monotonic_ns(),
        flags,
        ..Snapshot::default()
    };
    let options = WriterOptions::default();
    let _a = ShmWriter::create(
        dir.path(),
        &EngineId::new("a").unwrap(),
        &options,
        &snapshot(FLAG_SHUTTING_DOWN),
    )
    .unwrap();
    let mut b = ShmWriter::create(
        dir.path(),
        &EngineId::new("b").unwrap(),
        &options,
        &snapshot(0),
    )
    .unwrap();
    let uri = format!("file://{}", dir.path().display());
    let proxy = start_proxy(&[("a", &url_a), ("b", &url_b)], &["--uri", &uri]);
    let http = client();
    let one = |http: Http, url: String| async move {
        let body = json!({"prompt": [1, 2, 3], "max_tokens": 1});
        let response = post(&http, &url, serde_json::to_vec(&body).unwrap()).await;
        let status = response.status();
        let engine = response
            .headers()
            .get("x-esroute-engine")
            .map(|v| v.to_str().unwrap().to_owned());
        let text = response.into_body().collect().await.unwrap().to_bytes();
        (status, engine, String::from_utf8(text.to_vec()).unwrap())
    };
    // Polled: the feed reads every 50 ms; once read, "a" gets nothing.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let before = fake_a.requests.load(Ordering::Relaxed);
        let mut engines = Vec::new();
        for _ in 0..10 {
            engines.push(one(http.clone(), proxy.url.clone()).await.1);
        }
        if engines.iter().all(|e| e.as_deref() == Some("b"))
            && fake_a.requests.load(Ordering::Relaxed) == before
        {
            break;
        }
        assert!(Instant::now() < deadline, "still routed to a: {engines:?}");
    }
    b.publish(&snapshot(FLAG_SHUTTING_DOWN)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, _, text) = one(http.clone(), proxy.url.clone()).await;
        if status == 503 {
            assert!(text.contains("shutting down"), "{text}");
            break;
        }
        assert!(Instant::now() < deadline, "still routed: {status}");
    }
    reservations_return_to_zero(&http, &proxy).await;
}

/// Two replicas sharing reservations: a request one of them holds shows in
/// the other's view of the engine as a peer's, and leaves it when released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_reservations() {
    let (url, _fake) = start_fake().await;
    let parent = tempfile::tempdir().unwrap();
    // The replicas' directory is `<dir>.routers`: inside `parent` too.
    let uri = format!("file://{}", parent.path().join("engines").display());
    let share = |id: &'static str| {
        let args = ["--uri", &uri, "--replica-id", id, "--share-reservations"];
        start_proxy(&[("a", &url)], &args)
    };
    let (one, two) = (share("r1"), share("r2"));
    let http = client();
    let peers_of_a =
        |text: &str| metric_line(text, "esroute_engine_requests{engine=\"a\",view=\"peers\"}");
    let body = json!({"prompt": [1, 2, 3], "max_tokens": 5, "fake": "stall"});
    let response = post(&http, &one.url, serde_json::to_vec(&body).unwrap()).await;
    let mut stream = response.into_body();
    assert!(stream.frame().await.unwrap().unwrap().is_data());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = get_text(&http, &format!("{}/metrics", two.url)).await;
        if peers_of_a(&text) == Some(1.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "r2 never saw r1's reservation:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(stream);
    reservations_return_to_zero(&http, &one).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = get_text(&http, &format!("{}/metrics", two.url)).await;
        if peers_of_a(&text) == Some(0.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "r1's released reservation stays in r2:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of the sample whose name and labels are exactly `series`.
fn metric_line(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

/// 300 requests at once, 5 % cancelled by the client after the first chunk
/// and 2 % failing upstream mid-stream: every other one completes, and no
/// reservation is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_reservation_leaks_under_cancels_and_failures() {
    let (url_a, _a) = start_fake().await;
    let (url_b, _b) = start_fake().await;
    let proxy = start_proxy(&[("a", &url_a), ("b", &url_b)], &["--no-engine-state"]);
    let http = client();
    let mut tasks = Vec::new();
    for i in 0..300u32 {
        let (http, url) = (http.clone(), proxy.url.clone());
        tasks.push(tokio::spawn(async move {
            let mode = match i {
                _ if i % 20 == 0 => "stall",
                _ if i % 50 == 7 => "fail",
                _ => "",
            };
            let prompt: Vec<u32> = (0..100 + i).collect();
            let body = json!({"prompt": prompt, "max_tokens": 3, "fake": mode});
            let request = hyper::Request::post(format!("{url}/v1/completions"))
                .body(Full::new(Bytes::from(serde_json::to_vec(&body).unwrap())))
                .unwrap();
            let outcome = http.request(request).await;
            match mode {
                "stall" => {
                    let mut stream = outcome.unwrap().into_body();
                    assert!(stream.frame().await.unwrap().unwrap().is_data());
                    drop(stream);
                }
                "fail" => {
                    if let Ok(response) = outcome {
                        assert!(response.into_body().collect().await.is_err());
                    }
                }
                _ => {
                    let text = outcome.unwrap().into_body().collect().await.unwrap();
                    assert!(String::from_utf8_lossy(&text.to_bytes()).ends_with("[DONE]\n\n"));
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let text = reservations_return_to_zero(&http, &proxy).await;
    assert_eq!(
        metric(&text, "esroute_client_cancels_total"),
        Some(15.0),
        "{text}"
    );
}

/// A first chunk that comes soon after the head is forwarded at once, not
/// after the client's delayed ACK of the head (40 ms on Linux, on a
/// kept-alive connection): esroute's accepted sockets have TCP_NODELAY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_chunk_soon_after_the_head_is_not_held_back() {
    let (url, _fake) = start_fake().await;
    let proxy = start_proxy(&[("a", &url)], &["--no-engine-state"]);
    let http = client();
    let mut firsts = Vec::new();
    for _ in 0..20 {
        let body = json!({"prompt": [1, 2, 3], "max_tokens": 2, "fake": "late"});
        let started = Instant::now();
        let mut stream = post(&http, &proxy.url, serde_json::to_vec(&body).unwrap())
            .await
            .into_body();
        assert!(stream.frame().await.unwrap().unwrap().is_data());
        firsts.push(started.elapsed());
        while stream.frame().await.is_some() {}
    }
    firsts.sort();
    assert!(firsts[10] < Duration::from_millis(35), "{firsts:?}");
}
