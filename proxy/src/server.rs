//! The routes: `POST /v1/completions` and `/v1/chat/completions` (pick,
//! reserve, forward, stream back), `GET /v1/models` (passed through),
//! `GET /health`, `GET /metrics`; and
//! [`run`] / [`serve`], which start the feed and serve until shutdown.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use bytes::Bytes;
use engine_state_publisher::{ReplicaOptions, ReplicaPublisher};
use engine_state_router::{Request, Router, ENGINE_HEADER, SESSION_HEADER};
use engine_state_shm_format::EngineId;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;

use crate::config::{Config, EngineSpec};
use crate::error::Error;
use crate::feed::{spawn_feed, DeadWriters, Health};
use crate::metrics::ProxyMetrics;
use crate::prompt::prompt_tokens;
use crate::stream::ReservedBody;

/// The header a request id is taken from and forwarded in.
const REQUEST_ID_HEADER: &str = "x-request-id";

type Upstream = Client<HttpConnector, Full<Bytes>>;

struct App {
    router: Router,
    /// Engine id → base URL.
    urls: HashMap<String, String>,
    client: Upstream,
    metrics: Arc<ProxyMetrics>,
    health: Arc<Health>,
    config: Config,
    next_request: AtomicU64,
}

/// Binds `addr` and [`serve`]s on it.
pub async fn run(
    config: Config,
    addr: &str,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Listen {
            addr: addr.to_owned(),
            source,
        })?;
    serve(config, listener, shutdown).await
}

/// Serves on `listener` until `shutdown` resolves, then stops accepting and
/// lets in-flight streams finish (at most `drain_timeout`).
pub async fn serve(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    if config.engines.is_empty() {
        return Err(Error::Config(
            "no engines: give at least one --engine ID=URL, or an --engines-file with ID=URL lines"
                .to_owned(),
        ));
    }
    EngineSpec::check_unique(&config.engines)?;
    let router = Router::with_instances(
        config.settings.clone(),
        config.engines.iter().map(|e| e.id.as_str()),
    )?;
    if config.share_reservations {
        let (Some(uri), Some(replica_id)) = (&config.state_uri, &config.replica_id) else {
            return Err(Error::Config(
                "--share-reservations needs --replica-id (and an engine-state --uri)".to_owned(),
            ));
        };
        let id = EngineId::new(replica_id).map_err(|e| Error::Sharing(e.to_string()))?;
        let publisher = ReplicaPublisher::start(uri, &id, ReplicaOptions::default())
            .map_err(|e| Error::Sharing(e.to_string()))?;
        router.set_reservation_sink(Some(Box::new(publisher)));
    }
    let proxy_metrics = Arc::new(ProxyMetrics::new(
        config.engines.iter().map(|e| e.id.as_str()),
    ));
    let engine_health = Arc::new(Health::new(proxy_metrics.engines_down.clone()));
    let stop_feed = Arc::new(AtomicBool::new(false));
    let feed = match &config.state_uri {
        Some(uri) => Some(
            spawn_feed(
                router.clone(),
                uri.clone(),
                config
                    .share_reservations
                    .then(|| config.replica_id.clone())
                    .flatten(),
                config.poll_interval,
                engine_health.clone(),
                DeadWriters::new(config.engines.iter().map(|e| e.id.as_str())),
                stop_feed.clone(),
            )
            .map_err(|e| Error::Config(format!("could not start the feed thread: {e}")))?,
        ),
        None => None,
    };
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(config.connect_timeout));
    connector.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new()).build(connector);
    let app = Arc::new(App {
        urls: config
            .engines
            .iter()
            .map(|e| (e.id.clone(), e.url.clone()))
            .collect(),
        metrics: proxy_metrics,
        router: router.clone(),
        client,
        health: engine_health,
        config,
        next_request: AtomicU64::new(0),
    });
    let retry = tokio::spawn(retry_down_engines(app.clone()));
    let routes = axum::Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .with_state(app.clone());
    let drain_timeout = app.config.drain_timeout;
    let draining = Arc::new(tokio::sync::Notify::new());
    let notify = draining.clone();
    // Nagle on the client's socket would hold a stream's first chunk until
    // the client's delayed ACK of the head (~40 ms): chunks go out at once.
    let listener = listener.tap_io(|tcp| {
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::debug!("could not set TCP_NODELAY on a client connection: {error}");
        }
    });
    let server = axum::serve(listener, routes).with_graceful_shutdown(async move {
        shutdown.await;
        tracing::info!("shutting down: no new connections; draining in-flight streams");
        notify.notify_one();
    });
    let served = tokio::select! {
        served = server => served,
        () = async { draining.notified().await; tokio::time::sleep(drain_timeout).await } => {
            tracing::warn!("in-flight streams still open after {drain_timeout:?}; stopping anyway");
            Ok(())
        }
    };
    retry.abort();
    // Release: pairs with the feed thread's Acquire load.
    stop_feed.store(true, Ordering::Release);
    if let Some(feed) = feed {
        let _ = tokio::task::spawn_blocking(move || feed.join()).await;
    }
    // Retires the replica's file, so the peers drop its reservations now.
    router.set_reservation_sink(None);
    served.map_err(|source| Error::Listen {
        addr: "the listener".to_owned(),
        source,
    })
}

async fn completions(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    route(&app, headers, body, "/v1/completions", false)
        .await
        .unwrap_or_else(|error| refuse(&app, error))
}

async fn chat_completions(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    route(&app, headers, body, "/v1/chat/completions", true)
        .await
        .unwrap_or_else(|error| refuse(&app, error))
}

fn refuse(app: &App, error: Error) -> Response {
    match &error {
        Error::BadRequest(_) => app.metrics.refused("bad_request"),
        Error::TooLarge { .. } => app.metrics.refused("too_large"),
        Error::Unavailable(_) => app.metrics.refused("unavailable"),
        _ => {}
    }
    error.into_response()
}

/// Reads the body, picks and reserves, forwards; connection failures take
/// the engine out of routing and the request is placed again elsewhere.
async fn route(
    app: &App,
    headers: HeaderMap,
    body: Body,
    path: &str,
    chat: bool,
) -> Result<Response, Error> {
    let limit = app.config.max_body_bytes;
    let bytes = match Limited::new(body, limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) if error.downcast_ref::<LengthLimitError>().is_some() => {
            return Err(Error::TooLarge { limit })
        }
        Err(error) => {
            return Err(Error::BadRequest(format!(
                "could not read the request body: {error}"
            )))
        }
    };
    let json: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| Error::BadRequest(format!("the request body is not valid JSON: {e}")))?;
    let prompt = prompt_tokens(&json, chat)?;
    let header_text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let session = header_text(SESSION_HEADER).or(prompt.session_id);
    let request_id = header_text(REQUEST_ID_HEADER).unwrap_or_else(|| {
        format!(
            "esroute-{}",
            app.next_request.fetch_add(1, Ordering::Relaxed)
        )
    });
    let mut request = Request::from_tokens(request_id.clone(), prompt.tokens);
    if let Some(session) = session {
        request = request.with_session(session);
    }
    // Each failed connection takes one engine out, so this ends.
    for _ in 0..=app.urls.len() {
        let picking = Instant::now();
        let picked = app.router.pick(&request);
        app.metrics.pick.record(picking.elapsed().as_secs_f64());
        let (decision, mut reservation) = match picked {
            Ok(picked) => picked,
            Err(
                engine_state_router::Error::NoInstances
                | engine_state_router::Error::AllShuttingDown,
            ) => return Err(Error::Unavailable(app.health.describe())),
            Err(error) => return Err(Error::BadRequest(error.to_string())),
        };
        let engine = decision.instance_id;
        let engine_metrics = app.metrics.engine(&engine);
        engine_metrics.decisions.increment(1);
        let mut upstream = hyper::Request::builder()
            .method(Method::POST)
            .uri(format!("{}{path}", app.urls[&engine]))
            .header(header::CONTENT_TYPE, "application/json")
            .header(REQUEST_ID_HEADER, &request_id)
            .body(Full::new(bytes.clone()))
            .map_err(|e| Error::BadRequest(format!("cannot forward the request: {e}")))?;
        if let Some(value) = headers.get(header::ACCEPT) {
            upstream.headers_mut().insert(header::ACCEPT, value.clone());
        }
        let forwarded_at = Instant::now();
        let read_timeout = app.config.read_timeout;
        match tokio::time::timeout(read_timeout, app.client.request(upstream)).await {
            Err(_) => {
                reservation.fail();
                engine_metrics.upstream_error("timeout");
                return Err(Error::Upstream {
                    engine,
                    what: format!(
                        "sent no response head within {read_timeout:?} (--read-timeout-ms)"
                    ),
                    timeout: true,
                });
            }
            Ok(Err(error)) if error.is_connect() => {
                reservation.fail();
                engine_metrics.upstream_error("connect");
                app.health.mark_down(
                    &app.router,
                    &engine,
                    format!("cannot connect to {}: {}", app.urls[&engine], chain(&error)),
                );
            }
            Ok(Err(error)) => {
                reservation.fail();
                engine_metrics.upstream_error("stream");
                return Err(Error::Upstream {
                    engine,
                    what: format!("failed before answering: {}", chain(&error)),
                    timeout: false,
                });
            }
            Ok(Ok(response)) => {
                let status = response.status();
                if !status.is_success() {
                    engine_metrics.upstream_error("status");
                }
                let (parts, incoming) = response.into_parts();
                let body = ReservedBody::new(
                    incoming,
                    reservation,
                    app.metrics.clone(),
                    forwarded_at,
                    status.is_success(),
                    read_timeout,
                );
                let mut response = Response::new(Body::new(body));
                *response.status_mut() = status;
                for name in [header::CONTENT_TYPE, header::CACHE_CONTROL] {
                    if let Some(value) = parts.headers.get(&name) {
                        response.headers_mut().insert(name, value.clone());
                    }
                }
                if let Ok(value) = HeaderValue::from_str(&engine) {
                    response.headers_mut().insert(ENGINE_HEADER, value);
                }
                return Ok(response);
            }
        }
    }
    Err(Error::Unavailable(app.health.describe()))
}

/// Every `health_retry`, asks each engine that is out of routing for
/// `GET /health`; a 2xx puts it back.
async fn retry_down_engines(app: Arc<App>) {
    loop {
        tokio::time::sleep(app.config.health_retry).await;
        for engine in app.health.down_ids() {
            let Ok(uri) = format!("{}/health", app.urls[&engine]).parse::<hyper::Uri>() else {
                continue;
            };
            let Ok(request) = hyper::Request::get(uri).body(Full::new(Bytes::new())) else {
                continue;
            };
            let answer =
                tokio::time::timeout(app.config.connect_timeout, app.client.request(request)).await;
            if matches!(answer, Ok(Ok(response)) if response.status().is_success()) {
                app.health.mark_up(&app.router, &engine);
            }
        }
    }
}

/// `GET /v1/models`: the first routed engine's answer (every engine is
/// expected to serve the same model; benchmark clients ask for its name).
async fn models(State(app): State<Arc<App>>) -> Response {
    let Some(engine) = app.router.instance_ids().into_iter().next() else {
        return refuse(&app, Error::Unavailable(app.health.describe()));
    };
    let request = format!("{}/v1/models", app.urls[&engine])
        .parse::<hyper::Uri>()
        .ok()
        .and_then(|uri| hyper::Request::get(uri).body(Full::new(Bytes::new())).ok());
    let Some(request) = request else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let timeout = app.config.read_timeout;
    let answer = match tokio::time::timeout(timeout, app.client.request(request)).await {
        Ok(Ok(response)) => {
            let (parts, body) = response.into_parts();
            match tokio::time::timeout(timeout, body.collect()).await {
                Ok(Ok(body)) => Ok((parts.status, body.to_bytes())),
                Ok(Err(error)) => Err(error.to_string()),
                Err(_) => Err(format!("no answer within {timeout:?}")),
            }
        }
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("no answer within {timeout:?}")),
    };
    match answer {
        Ok((status, body)) => (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            Body::from(body),
        )
            .into_response(),
        Err(what) => Error::Upstream {
            engine,
            what: format!("did not answer GET /v1/models: {what}"),
            timeout: false,
        }
        .into_response(),
    }
}

async fn health(State(app): State<Arc<App>>) -> Response {
    let routed = app.router.instance_ids();
    let down = app.health.down_ids();
    let status = if routed.is_empty() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    let body = serde_json::json!({ "routed": routed, "down": down });
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(&app.router),
    )
        .into_response()
}

/// An error with its causes, `outer: inner: innermost` (hyper's own
/// message alone says only "client error (Connect)").
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
