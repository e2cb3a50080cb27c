//! The proxy's Prometheus families (`GET /metrics`). One recorder per
//! [`run`](crate::run), never the process-wide one, so several proxies in
//! one process (tests, an embedding program) keep their metrics apart; the
//! handles are made once under it and used from any task.

use std::collections::HashMap;
use std::time::Duration;

use engine_state_router::Router;
use metrics::{Counter, Gauge, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusRecorder};

/// Picks made, by engine (label `engine`).
pub const DECISIONS: &str = "esroute_decisions_total";
/// Upstream failures, by engine and `kind` (`connect`, `status`, `stream`, `timeout`).
pub const UPSTREAM_ERRORS: &str = "esroute_upstream_errors_total";
/// Reservations the router holds now (made minus released): zero when idle.
pub const RESERVATIONS_HELD: &str = "esroute_reservations_held";
/// Time from forwarding a request to its first response chunk, by engine.
pub const UPSTREAM_LATENCY: &str = "esroute_upstream_first_chunk_seconds";
/// Requests refused before forwarding, by `reason` (`bad_request`, `too_large`, `unavailable`).
pub const REFUSED: &str = "esroute_refused_total";
/// Client streams that ended before the upstream did.
pub const CLIENT_CANCELS: &str = "esroute_client_cancels_total";
/// Requests in flight per engine as the router sees them, by `view`:
/// `own` (this replica's reservations), `peers` (the other replicas'),
/// `effective` (`max(own + peers, real)`).
pub const ENGINE_REQUESTS: &str = "esroute_engine_requests";
/// Engines currently taken out of routing after a failed connection or
/// because their engine-state writer died.
pub const ENGINES_DOWN: &str = "esroute_engines_down";
/// The router's pick and reserve of one request (one `Router::pick` call).
pub const PICK: &str = "esroute_pick_seconds";
/// Reservations released, by `outcome` as the router counts them:
/// `completed` (the stream ended), `failed` (an upstream error, status or
/// timeout), `dropped` (the client went away).
pub const RELEASES: &str = "esroute_releases_total";

const KINDS: [&str; 4] = ["connect", "status", "stream", "timeout"];
const VIEWS: [&str; 3] = ["own", "peers", "effective"];
const REASONS: [&str; 3] = ["bad_request", "too_large", "unavailable"];
const OUTCOMES: [&str; 3] = ["completed", "failed", "dropped"];
/// A pick takes microseconds: its own buckets, 1 µs to 10 ms.
const PICK_BUCKETS: [f64; 12] = [
    1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 1e-2,
];

/// Per-engine handles.
#[derive(Debug)]
pub(crate) struct EngineMetrics {
    pub decisions: Counter,
    pub latency: Histogram,
    errors: [Counter; 4],
    /// `own`, `peers`, `effective`.
    requests: [Gauge; 3],
}

impl EngineMetrics {
    pub fn upstream_error(&self, kind: &str) {
        if let Some(i) = KINDS.iter().position(|k| *k == kind) {
            self.errors[i].increment(1);
        }
    }

    pub fn first_chunk(&self, elapsed: Duration) {
        self.latency.record(elapsed.as_secs_f64());
    }
}

/// Every handle, and the recorder that renders them.
#[derive(Debug)]
pub(crate) struct ProxyMetrics {
    recorder: PrometheusRecorder,
    engines: HashMap<String, EngineMetrics>,
    refused: [Counter; 3],
    pub client_cancels: Counter,
    held: Gauge,
    pub engines_down: Gauge,
    /// Seconds per `Router::pick`.
    pub pick: Histogram,
    /// `completed`, `failed`, `dropped`.
    releases: [Counter; 3],
}

impl ProxyMetrics {
    pub fn new<'a>(engine_ids: impl IntoIterator<Item = &'a str>) -> ProxyMetrics {
        let buckets = [
            0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0,
        ];
        let recorder = PrometheusBuilder::new()
            .set_buckets(&buckets)
            .expect("non-empty bucket list")
            .set_buckets_for_metric(Matcher::Full(PICK.to_owned()), &PICK_BUCKETS)
            .expect("non-empty bucket list")
            .build_recorder();
        let engine_ids: Vec<&str> = engine_ids.into_iter().collect();
        let (engines, refused, client_cancels, held, engines_down, pick, releases) =
            metrics::with_local_recorder(&recorder, || {
                metrics::describe_counter!(DECISIONS, "Picks made (reservations taken), by engine");
                metrics::describe_counter!(
                    UPSTREAM_ERRORS,
                    "Upstream failures by engine and kind (connect, status, stream, timeout)"
                );
                metrics::describe_gauge!(
                    RESERVATIONS_HELD,
                    "Reservations the router holds now (made minus released)"
                );
                metrics::describe_histogram!(
                    UPSTREAM_LATENCY,
                    metrics::Unit::Seconds,
                    "Time from forwarding a request to its first response chunk"
                );
                metrics::describe_counter!(
                    REFUSED,
                    "Requests refused before forwarding, by reason"
                );
                metrics::describe_counter!(
                    CLIENT_CANCELS,
                    "Client streams that ended before the upstream's"
                );
                metrics::describe_gauge!(
                    ENGINES_DOWN,
                    "Engines out of routing after a failed connection or a dead writer"
                );
                metrics::describe_histogram!(
                    PICK,
                    metrics::Unit::Seconds,
                    "The router's pick and reserve of one request"
                );
                metrics::describe_counter!(
                    RELEASES,
                    "Reservations released, by outcome (completed, failed, dropped)"
                );
                let engines = engine_ids
                .iter()
                .map(|id| {
                    let id = id.to_string();
                    let handles = EngineMetrics {
                        decisions: metrics::counter!(DECISIONS, "engine" => id.clone()),
                        latency: metrics::histogram!(UPSTREAM_LATENCY, "engine" => id.clone()),
                        requests: VIEWS.map(|view| {
                            metrics::gauge!(ENGINE_REQUESTS, "engine" => id.clone(), "view" => view)
                        }),
                        errors: KINDS.map(|kind| {
                            metrics::counter!(UPSTREAM_ERRORS, "engine" => id.clone(), "kind" => kind)
                        }),
                    };
                    (id, handles)
                })
                .collect();
                (
                    engines,
                    REASONS.map(|reason| metrics::counter!(REFUSED, "reason" => reason)),
                    metrics::counter!(CLIENT_CANCELS),
                    metrics::gauge!(RESERVATIONS_HELD),
                    metrics::gauge!(ENGINES_DOWN),
                    metrics::histogram!(PICK),
                    OUTCOMES.map(|outcome| metrics::counter!(RELEASES, "outcome" => outcome)),
                )
            });
        ProxyMetrics {
            recorder,
            engines,
            refused,
            client_cancels,
            held,
            engines_down,
            pick,
            releases,
        }
    }

    pub fn engine(&self, id: &str) -> &EngineMetrics {
        &self.engines[id]
    }

    pub fn refused(&self, reason: &str) {
        if let Some(i) = REASONS.iter().position(|r| *r == reason) {
            self.refused[i].increment(1);
        }
    }

    /// The text exposition, with the held reservations and the releases read
    /// from the router now.
    pub fn render(&self, router: &Router) -> String {
        self.held.set(reservations_held(router) as f64);
        let stats = router.stats();
        for (counter, value) in
            self.releases
                .iter()
                .zip([stats.completed, stats.failed, stats.dropped])
        {
            counter.absolute(value);
        }
        let views = router.instances();
        for (id, handles) in &self.engines {
            let view = views.iter().find(|v| &v.instance_id == id);
            let values = view.map_or([0; 3], |v| {
                [
                    v.shadow.num_requests,
                    v.peers.num_requests,
                    v.effective.num_requests,
                ]
            });
            for (gauge, value) in handles.requests.iter().zip(values) {
                gauge.set(value as f64);
            }
        }
        self.recorder.handle().render()
    }
}

/// Reservations made minus released, from the router's own counters.
pub(crate) fn reservations_held(router: &Router) -> u64 {
    let stats = router.stats();
    stats
        .decisions
        .saturating_sub(stats.completed + stats.failed + stats.dropped + stats.migrated)
}
