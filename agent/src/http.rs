//! A deliberately tiny HTTP/1.1 responder for `GET /metrics` and
//! `GET /healthz` (one request per connection; no keep-alive, no bodies in).
//! Prometheus scrapers and health probes need nothing more, and it keeps
//! hyper out of the agent.

use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::health::Health;

/// Longest request head accepted.
const MAX_REQUEST: usize = 8192;
/// A client must send its request within this time.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves connections on `listener` until `shutdown` is cancelled.
pub async fn serve(
    listener: TcpListener,
    metrics: PrometheusHandle,
    health: Arc<Health>,
    shutdown: CancellationToken,
) {
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    eprintln!("esagent: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let (metrics, health) = (metrics.clone(), health.clone());
        tokio::spawn(async move {
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, respond(stream, &metrics, &health)).await;
        });
    }
}

async fn respond(
    mut stream: TcpStream,
    metrics: &PrometheusHandle,
    health: &Health,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|b| *b == b'\n').next().unwrap_or(&[]);
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            metrics.render(),
        ),
        ("GET", "/healthz") => {
            let (healthy, text) = health.report();
            let status = if healthy {
                "200 OK"
            } else {
                "503 Service Unavailable"
            };
            (status, "text/plain; charset=utf-8", text)
        }
        ("GET", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "esagent serves GET /metrics and GET /healthz\n".to_owned(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "esagent serves GET /metrics and GET /healthz\n".to_owned(),
        ),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}
