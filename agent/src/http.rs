//! A deliberately tiny HTTP/1.1 responder for `GET /metrics` and
//! `GET /healthz` (one request per connection; no keep-alive, no bodies in).
//! Prometheus scrapers and health probes need nothing more, and it keeps
//! hyper out of the agent.
//!
//! It must never take what the relay needs: at most `max_connections` are
//! open at once (beyond that, new connections wait in the kernel's accept
//! queue, holding none of the agent's file descriptors), a client that has
//! not sent its request within [`REQUEST_TIMEOUT`] is dropped, and failed
//! accepts (EMFILE) back off instead of spinning.

use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::health::Health;

/// Longest request head accepted.
const MAX_REQUEST: usize = 8192;
/// A client must send its request within this time (an idle or slow
/// connection is closed after it).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// A whole exchange (request and response) ends within this time.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);
/// Most connections served at once (fewer under a low descriptor limit:
/// see [`connection_cap`]).
pub const MAX_CONNECTIONS: usize = 256;
/// First and longest pause after a failed accept.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));
/// Failed accepts are reported again only after accepts worked this long.
const ACCEPT_QUIET: Duration = Duration::from_secs(1);

/// How many HTTP connections may be open at once under a limit of
/// `fd_limit` open files: a quarter of it (the rest is the relay's: the
/// directory listing, opening engines' files, Redis), at most
/// [`MAX_CONNECTIONS`], at least 4.
pub fn connection_cap(fd_limit: u64) -> usize {
    (fd_limit / 4).clamp(4, MAX_CONNECTIONS as u64) as usize
}

/// Serves connections on `listener`, at most `max_connections` at once,
/// until `shutdown` is cancelled.
pub async fn serve(
    listener: TcpListener,
    metrics: PrometheusHandle,
    health: Arc<Health>,
    max_connections: usize,
    shutdown: CancellationToken,
) {
    let permits = Arc::new(Semaphore::new(max_connections));
    let mut backoff = ACCEPT_BACKOFF.0;
    // Failed accepts since the last report, and when the latest one's
    // backoff ended (quiet time counts from the retry, not the failure).
    let mut trouble: Option<(u64, Instant)> = None;
    loop {
        // At the cap, wait for a connection to end before accepting another.
        let permit = tokio::select! {
            _ = shutdown.cancelled() => return,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return, // never closed
            },
        };
        let stream = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors (EMFILE/ENFILE) or memory: retrying
                    // at once would spin. Reported once, until accepts have
                    // worked for ACCEPT_QUIET.
                    match trouble.as_mut() {
                        None => {
                            tracing::warn!(
                                "esagent: accept failed: {e}; HTTP paused with backoff ({:?} to \
                                 {:?}), the relay goes on",
                                ACCEPT_BACKOFF.0, ACCEPT_BACKOFF.1
                            );
                            trouble = Some((1, Instant::now() + backoff));
                        }
                        Some((failures, retry)) => {
                            (*failures, *retry) = (*failures + 1, Instant::now() + backoff);
                        }
                    }
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(ACCEPT_BACKOFF.1);
                    continue;
                }
            },
        };
        backoff = ACCEPT_BACKOFF.0;
        if let Some((failures, retry)) = trouble {
            if retry.elapsed() >= ACCEPT_QUIET {
                tracing::info!(
                    "esagent: accepting HTTP connections again ({failures} accepts failed)"
                );
                trouble = None;
            }
        }
        let (metrics, health) = (metrics.clone(), health.clone());
        tokio::spawn(async move {
            let _permit = permit; // released when the connection is closed
            let _ =
                tokio::time::timeout(CONNECTION_TIMEOUT, respond(stream, &metrics, &health)).await;
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
    let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST {
        let n = match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(read) => read?,
            Err(_) => return Ok(()), // idle or too slow: closed without a word
        };
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
