//! No reservation leaks (issue 23, done-when): 10,000 requests through an
//! in-process esroute (`engine_state_proxy::serve`) over two fake engines
//! (support/mod.rs) at 64 at a time, 5 % cancelled by the client after the
//! first chunk, 1 % failing upstream (half mid-stream: the engine aborts the
//! connection after the first chunk; half before the stream: a 500). The
//! proxy's `/metrics` must count every outcome exactly and hold nothing at
//! the end, in its own gauge and in the router's per-engine view.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use engine_state_proxy::{Config, EngineSpec};
use http_body_util::{BodyExt, Full};
use serde_json::json;

use support::*;

const REQUESTS: u32 = 10_000;
const CONCURRENCY: usize = 64;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Complete,
    /// The client drops the stream after its first chunk (5 %).
    Cancel,
    /// The engine aborts the connection after the first chunk (0.5 %).
    FailMidStream,
    /// The engine answers 500 (0.5 %).
    Status500,
}

fn kind(i: u32) -> Kind {
    match i {
        _ if i % 20 == 0 => Kind::Cancel,
        _ if i % 200 == 7 => Kind::FailMidStream,
        _ if i % 200 == 107 => Kind::Status500,
        _ => Kind::Complete,
    }
}

async fn one(http: &Http, url: &str, i: u32) {
    let (fake, fail_at) = match kind(i) {
        Kind::Complete => ("", 0),
        Kind::Cancel => ("stall", 0),
        Kind::FailMidStream => ("fail", 1),
        Kind::Status500 => ("status500", 0),
    };
    let prompt: Vec<u32> = (0..32 + i % 64).collect();
    let body = json!({"prompt": prompt, "max_tokens": 3, "stream": true,
                      "session_id": format!("s{}", i % 100),
                      "fake": fake, "fake_fail_at": fail_at});
    let request = hyper::Request::post(format!("{url}/v1/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(&body).unwrap())))
        .unwrap();
    let outcome = http.request(request).await;
    match kind(i) {
        Kind::Complete => {
            let response = outcome.unwrap();
            assert_eq!(response.status(), 200, "request {i}");
            let text = response.into_body().collect().await.unwrap().to_bytes();
            assert!(text.ends_with(b"data: [DONE]\n\n"), "request {i}");
        }
        Kind::Cancel => {
            let mut stream = outcome.unwrap().into_body();
            assert!(stream.frame().await.unwrap().unwrap().is_data());
            drop(stream);
        }
        Kind::FailMidStream => {
            // Aborted before the head reached the client, or in the body.
            if let Ok(response) = outcome {
                assert!(response.into_body().collect().await.is_err(), "request {i}");
            }
        }
        Kind::Status500 => {
            let response = outcome.unwrap();
            assert_eq!(response.status(), 500, "request {i}");
            response.into_body().collect().await.unwrap();
        }
    }
}

/// The sum of a family's samples whose series starts with `prefix`.
fn sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(prefix))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_requests_with_cancels_and_failures_leak_nothing() {
    let started = Instant::now();
    let (url_a, _a) = start_fake().await;
    let (url_b, _b) = start_fake().await;
    let engines: Vec<EngineSpec> = [format!("a={url_a}"), format!("b={url_b}")]
        .iter()
        .map(|spec| spec.parse().unwrap())
        .collect();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let proxy = tokio::spawn(engine_state_proxy::serve(
        Config::new(engines),
        listener,
        async move {
            let _ = stopped.await;
        },
    ));
    let http = client();
    let next = Arc::new(AtomicU32::new(0));
    let workers: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (http, url, next) = (http.clone(), url.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= REQUESTS {
                        break;
                    }
                    one(&http, &url, i).await;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
    let sent = started.elapsed();
    let text = reservations_return_to_zero(&http, &url).await;
    let count = |kind: fn(u32) -> bool| (0..REQUESTS).filter(|&i| kind(i)).count() as f64;
    let cancels = count(|i| self::kind(i) == Kind::Cancel);
    let mid_stream = count(|i| self::kind(i) == Kind::FailMidStream);
    let status = count(|i| self::kind(i) == Kind::Status500);
    assert_eq!((cancels, mid_stream, status), (500.0, 50.0, 50.0));
    let completed = f64::from(REQUESTS) - cancels - mid_stream - status;
    assert_eq!(sum(&text, "esroute_decisions_total{"), f64::from(REQUESTS));
    assert_eq!(
        sum(&text, "esroute_pick_seconds_count"),
        f64::from(REQUESTS)
    );
    let releases = |outcome: &str| {
        metric_line(
            &text,
            &format!("esroute_releases_total{{outcome=\"{outcome}\"}}"),
        )
    };
    assert_eq!(releases("completed"), Some(completed), "{text}");
    assert_eq!(releases("failed"), Some(mid_stream + status), "{text}");
    assert_eq!(releases("dropped"), Some(cancels), "{text}");
    assert_eq!(metric(&text, "esroute_client_cancels_total"), Some(cancels));
    let errors = |kind: &str| {
        sum(
            &text,
            &format!("esroute_upstream_errors_total{{engine=\"a\",kind=\"{kind}\"}}"),
        ) + sum(
            &text,
            &format!("esroute_upstream_errors_total{{engine=\"b\",kind=\"{kind}\"}}"),
        )
    };
    assert_eq!(errors("stream"), mid_stream, "{text}");
    assert_eq!(errors("status"), status, "{text}");
    assert_eq!(errors("connect") + errors("timeout"), 0.0, "{text}");
    assert_eq!(sum(&text, "esroute_refused_total{"), 0.0, "{text}");
    assert_eq!(metric(&text, "esroute_reservations_held"), Some(0.0));
    for engine in ["a", "b"] {
        for view in ["own", "effective"] {
            let series = format!("esroute_engine_requests{{engine=\"{engine}\",view=\"{view}\"}}");
            assert_eq!(metric_line(&text, &series), Some(0.0), "{series}\n{text}");
        }
    }
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), proxy)
        .await
        .expect("the proxy drains and stops")
        .unwrap()
        .unwrap();
    eprintln!("{REQUESTS} requests in {sent:?}");
}
