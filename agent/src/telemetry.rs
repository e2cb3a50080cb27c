//! The agent's Prometheus metrics (names are the contract: docs/REDIS.md).
//!
//! Per engine (label `engine`): one gauge per snapshot field
//! (`engine_state_<field>`), `engine_state_gpu_kv_used_frac`,
//! `engine_state_heartbeat_age_seconds`, `engine_state_capture_age_seconds`
//! and `engine_state_status` (label `status`, 1 for the current one).
//! Agent-wide: histograms `engine_state_snapshot_age_seconds` (capture age of
//! each relayed record) and `engine_state_relay_lag_seconds` (engine's
//! heartbeat stamp → Redis acknowledged), counters
//! `engine_state_read_errors_total`, `engine_state_relay_errors_total`,
//! `engine_state_relayed_total`, gauges `engine_state_engines` and
//! `engine_state_redis_connected`.

use std::sync::OnceLock;
use std::time::Duration;

use engine_state_reader::{millis, Reading, Snapshot, Status};
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
        "Engine heartbeat stamp to Redis acknowledgement, per relayed record"
    );
    metrics::describe_counter!(
        READ_ERRORS,
        "Unreadable engine files and failed reads of the shared-memory directory"
    );
    metrics::describe_counter!(RELAY_ERRORS, "Failed Redis connections and pipelines");
    metrics::describe_counter!(RELAYED, "Records acknowledged by Redis");
}

/// Sets the per-engine gauges from one reading.
pub fn record_engines(reading: &Reading, redis_connected: bool) {
    metrics::gauge!("engine_state_engines").set(reading.engines.len() as f64);
    metrics::gauge!("engine_state_redis_connected").set(if redis_connected { 1.0 } else { 0.0 });
    for engine in &reading.engines {
        let id = engine.engine_id.to_string();
        let words = engine.snapshot.to_words();
        for (name, value) in Snapshot::FIELD_NAMES.iter().zip(words) {
            metrics::gauge!(format!("engine_state_{name}"), "engine" => id.clone())
                .set(value as f64);
        }
        if let Some(frac) = engine.gpu_kv_used_frac() {
            metrics::gauge!("engine_state_gpu_kv_used_frac", "engine" => id.clone()).set(frac);
        }
        metrics::gauge!("engine_state_heartbeat_age_seconds", "engine" => id.clone())
            .set(millis(engine.heartbeat_age) / 1000.0);
        metrics::gauge!("engine_state_capture_age_seconds", "engine" => id.clone())
            .set(millis(engine.capture_age) / 1000.0);
        for status in STATUSES {
            metrics::gauge!("engine_state_status", "engine" => id.clone(), "status" => status.as_str())
                .set(if engine.status == status { 1.0 } else { 0.0 });
        }
    }
}
