//! `esroute` as a real process in front of fake engines (support/mod.rs:
//! axum servers on 127.0.0.1:0 inside the test) that stream SSE chunks, and
//! can be told per request (the body's `fake` field, forwarded unchanged)
//! to fail mid-stream or to stall.

mod support;

use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};

use support::*;

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
    let text = reservations_return_to_zero(&http, &proxy.url).await;
    let decisions: f64 = text
        .lines()
        .filter(|l| l.starts_with("esroute_decisions_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(decisions, 100.0, "{text}");
    assert!(text.contains("esroute_upstream_first_chunk_seconds_bucket"));
    // One pick per request, timed in microseconds (its own buckets).
    assert_eq!(
        metric_line(&text, "esroute_pick_seconds_count"),
        Some(100.0),
        "{text}"
    );
    let pick_sum = metric_line(&text, "esroute_pick_seconds_sum").unwrap();
    assert!(pick_sum > 0.0 && pick_sum < 1.0, "{text}");
    assert!(
        text.contains("esroute_pick_seconds_bucket{le=\"0.00001\"}"),
        "{text}"
    );
    assert_eq!(
        metric_line(&text, "esroute_releases_total{outcome=\"completed\"}"),
        Some(100.0),
        "{text}"
    );
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
    let text = reservations_return_to_zero(&http, &proxy.url).await;
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
    reservations_return_to_zero(&http, &proxy.url).await;
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
    reservations_return_to_zero(&http, &proxy.url).await;

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
    reservations_return_to_zero(&http, &dead.url).await;
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
    let text = reservations_return_to_zero(&http, &proxy.url).await;
    assert!(
        text.contains("esroute_upstream_errors_total{engine=\"a\",kind=\"timeout\"} 1"),
        "{text}"
    );
}

/// `/v1/chat/completions` with text messages and the session in the
/// header; `/v1/models` passed through (esroute on one thread, `--threads 1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completions_are_routed_too() {
    let (url, fake) = start_fake().await;
    let proxy = start_proxy(&[("a", &url)], &["--no-engine-state", "--threads", "1"]);
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
    reservations_return_to_zero(&http, &proxy.url).await;
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
    reservations_return_to_zero(&http, &proxy.url).await;
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
    reservations_return_to_zero(&http, &one.url).await;
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
    let text = reservations_return_to_zero(&http, &proxy.url).await;
    assert_eq!(
        metric(&text, "esroute_client_cancels_total"),
        Some(15.0),
        "{text}"
    );
}

/// The first chunk goes out as it comes: with Nagle on the client's
/// socket, a chunk written while the response head is unacknowledged waits
/// for the client's delayed ACK (~40 ms on Linux). The engine sends its
/// head at once and its first chunk 2 ms later (a prefill), so the proxy
/// writes them apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_chunk_is_not_held_back_by_nagle() {
    let (url, _fake) = start_fake().await;
    let proxy = start_proxy(&[("a", &url)], &["--no-engine-state"]);
    let http = client();
    let body = json!({"prompt": [1, 2, 3], "max_tokens": 2, "fake_first_us": 2_000});
    let body = serde_json::to_vec(&body).unwrap();
    let mut ttft = Vec::new();
    // One keep-alive connection, as a client streaming request after
    // request; Linux ACKs the first few segments of a connection at once
    // (quick-ACK mode), so the delay shows from about the fifth request on.
    for _ in 0..25 {
        let sent = Instant::now();
        let response = post(&http, &proxy.url, body.clone()).await;
        let mut stream = response.into_body();
        assert!(stream.frame().await.unwrap().unwrap().is_data());
        ttft.push(sent.elapsed());
        stream.collect().await.unwrap();
    }
    ttft.sort();
    let median = ttft[ttft.len() / 2];
    assert!(
        median < Duration::from_millis(20),
        "the first chunk took {median:?} (all: {ttft:?})"
    );
}

/// `--engines-file` (comments, blank lines) together with `--engine`; a
/// bad line is named by its number, an id given twice is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_file_adds_to_engine_flags() {
    let (url_a, fake_a) = start_fake().await;
    let (url_b, fake_b) = start_fake().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("engines.txt");
    std::fs::write(&file, format!("# the fleet\n\nb={url_b}  # second\n")).unwrap();
    let file_arg = file.to_str().unwrap();
    let proxy = start_proxy(
        &[("a", &url_a)],
        &["--no-engine-state", "--engines-file", file_arg],
    );
    let http = client();
    let health = get_text(&http, &format!("{}/health", proxy.url)).await;
    assert!(health.contains("\"routed\":[\"a\",\"b\"]"), "{health}");
    for _ in 0..6 {
        let body = json!({"prompt": [1, 2, 3], "max_tokens": 1});
        let response = post(&http, &proxy.url, serde_json::to_vec(&body).unwrap()).await;
        assert_eq!(response.status(), 200);
        response.into_body().collect().await.unwrap();
    }
    let served = |fake: &Fake| fake.requests.load(Ordering::Relaxed);
    assert_eq!(served(&fake_a) + served(&fake_b), 6);
    assert!(served(&fake_b) > 0, "the file's engine is routed to");

    let refused = |file_text: String| {
        std::fs::write(&file, file_text).unwrap();
        let output = Command::new(env!("CARGO_BIN_EXE_esroute"))
            .args(["--listen", "127.0.0.1:0", "--no-engine-state"])
            .args([
                "--engine",
                &format!("a={url_a}"),
                "--engines-file",
                file_arg,
            ])
            .output()
            .unwrap();
        assert!(!output.status.success());
        assert!(output.stdout.is_empty(), "refused before listening");
        String::from_utf8(output.stderr).unwrap()
    };
    let error = refused(format!("b={url_b}\n# ok so far\nc=https://127.0.0.1:1\n"));
    assert!(error.contains("engines.txt, line 3: "), "{error}");
    let error = refused(format!("a={url_b}\n"));
    assert!(error.contains("\"a\" is given twice"), "{error}");
}
