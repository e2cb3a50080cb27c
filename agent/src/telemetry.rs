//! The agent's Prometheus metrics (names are the contract: docs/REDIS.md).
//!
//! Per engine (label `engine`): one gauge per snapshot field
//! (`engine_state_<field>`), `engine_state_gpu_kv_used_frac`,
//! `engine_state_heartbeat_age_seconds`, `engine_state_capture_age_seconds`
//! and `engine_state_status` (label `status`, 1 for the current one).
//! Agent-wide: histograms `engine_state_snapshot_age_seconds` (capture age of
//! each relayed record) and `engine_state_relay_lag_seconds` (engine's
//! heartbeat stamp → Redis's acknowledgement read, at the pass after the
//! write: up to one poll interval later than Redis sent it), counters
//! `engine_state_read_errors_total`, `engine_state_relay_errors_total`,
//! `engine_state_relayed_total`, gauges `engine_state_engines` and
//! `engine_state_redis_connected`.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use engine_state_reader::{millis, Reading, Snapshot, Status};
use metrics::Gauge;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;

/// Snapshot age histogram.
pub const SNAPSHOT_AGE: &str = "engine_state_snapshot_age_seconds";
/// Relay lag histogram.
pub const RELAY_LAG: &str = "engine_state_relay_lag_seconds";
/// Read error counter.
pub const READ_ERRORS: &str = "engine_state_read_errors_total";
/// Relay error counter.
pub const RELAY_ERRORS: &str = "engine_state_relay_errors_total";
/// Relayed record counter.
pub const RELAYED: &str = "engine_state_relayed_total";

/// Gauges of engines that stopped being updated disappear after this long.
const GAUGE_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

const STATUSES: [Status; 4] = [Status::Fresh, Status::Stale, Status::Dead, Status::Torn];

/// Installs the process-wide recorder once and returns its handle.
pub fn install() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let buckets = [
                0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
            ];
            let recorder = PrometheusBuilder::new()
                .set_buckets(&buckets)
                .expect("non-empty bucket list")
                .idle_timeout(MetricKindMask::GAUGE, Some(GAUGE_IDLE_TIMEOUT))
                .build_recorder();
            let handle = recorder.handle();
            // Another recorder may exist when the agent is embedded; then
            // this handle renders nothing, which the caller can see.
            let _ = metrics::set_global_recorder(recorder);
            describe();
            handle
        })
        .clone()
}

fn describe() {
    metrics::describe_histogram!(
        SNAPSHOT_AGE,
        metrics::Unit::Seconds,
        "Capture age of each snapshot relayed to Redis"
    );
    metrics::describe_histogram!(
        RELAY_LAG,
        metrics::Unit::Seconds,
        "Engine heartbeat stamp to Redis acknowledgement (read at the relay pass after the write), per relayed record"
    );
    metrics::describe_counter!(
        READ_ERRORS,
        "Unreadable engine files and failed reads of the shared-memory directory"
    );
    metrics::describe_counter!(RELAY_ERRORS, "Failed Redis connections and pipelines");
    metrics::describe_counter!(RELAYED, "Records acknowledged by Redis");
}

/// The per-engine gauges, registered once per engine: a registry lookup
/// (key formatting, label allocation, hashing) per gauge and refresh would
/// cost more than the relay itself at a thousand engines.
#[derive(Debug, Default)]
pub struct EngineGauges {
    engines: HashMap<Arc<str>, Gauges>,
}

#[derive(Debug)]
struct Gauges {
    fields: Vec<Gauge>,
    /// Registered only once the engine reports KV blocks.
    gpu_kv_used_frac: Option<Gauge>,
    heartbeat_age: Gauge,
    capture_age: Gauge,
    status: [Gauge; STATUSES.len()],
}

impl Gauges {
    fn new(id: &str) -> Gauges {
        let id = id.to_owned();
        Gauges {
            fields: Snapshot::FIELD_NAMES
                .iter()
                .map(|name| metrics::gauge!(format!("engine_state_{name}"), "engine" => id.clone()))
                .collect(),
            gpu_kv_used_frac: None,
            heartbeat_age: metrics::gauge!("engine_state_heartbeat_age_seconds", "engine" => id.clone()),
            capture_age: metrics::gauge!("engine_state_capture_age_seconds", "engine" => id.clone()),
            status: STATUSES.map(|status| {
                metrics::gauge!("engine_state_status", "engine" => id.clone(), "status" => status.as_str())
            }),
        }
    }
}

impl EngineGauges {
    /// Sets the per-engine gauges from one reading.
    pub fn record(&mut self, reading: &Reading, redis_connected: bool) {
        metrics::gauge!("engine_state_engines").set(reading.engines.len() as f64);
        metrics::gauge!("engine_state_redis_connected").set(if redis_connected {
            1.0
        } else {
            0.0
        });
        // Gauges of engines that left go idle and the exporter drops them;
        // a returning engine registers them again.
        self.engines.retain(|id, _| reading.get(id).is_some());
        for engine in &reading.engines {
            let gauges = self
                .engines
                .entry(engine.engine_id.clone())
                .or_insert_with(|| Gauges::new(&engine.engine_id));
            let words = engine.snapshot.to_words();
            for (gauge, value) in gauges.fields.iter().zip(words) {
                gauge.set(value as f64);
            }
            if let Some(frac) = engine.gpu_kv_used_frac() {
                gauges
                    .gpu_kv_used_frac
                    .get_or_insert_with(|| {
                        metrics::gauge!("engine_state_gpu_kv_used_frac", "engine" => engine.engine_id.to_string())
                    })
                    .set(frac);
            }
            gauges
                .heartbeat_age
                .set(millis(engine.heartbeat_age) / 1000.0);
            gauges.capture_age.set(millis(engine.capture_age) / 1000.0);
            for (gauge, status) in gauges.status.iter().zip(STATUSES) {
                gauge.set(if engine.status == status { 1.0 } else { 0.0 });
            }
        }
    }
}
