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
//! `engine_state_relayed_total`, `engine_state_relay_refused_total`,
//! `engine_state_registry_errors_total`, gauges `engine_state_engines` and
//! `engine_state_redis_connected`.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

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
/// Counter of records not relayed because another live process writes the
/// engine's key directly (`SinkStats::refused`).
pub const RELAY_REFUSED: &str = "engine_state_relay_refused_total";
/// Counter of registrations Redis refused because the registry key is not a
/// set (`SinkStats::registry_errors`).
pub const REGISTRY_ERRORS: &str = "engine_state_registry_errors_total";

/// Gauges of engines that stopped being updated disappear after this long.
const GAUGE_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Between refreshes of every gauge only the changed ones are set; a
/// refresh keeps unchanged gauges from idling out.
const GAUGE_REFRESH: Duration = Duration::from_secs(10);

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
    metrics::describe_counter!(
        RELAY_REFUSED,
        "Records not relayed because another live process writes the engine's Redis key"
    );
    metrics::describe_counter!(
        REGISTRY_ERRORS,
        "Registrations refused because the registry key is not a set (readers cannot find engines)"
    );
}

/// The per-engine gauges, registered once per engine: a registry lookup
/// (key formatting, label allocation, hashing) per gauge and refresh would
/// cost more than the relay itself at a thousand engines.
///
/// A gauge is set only when its value changed (each set is an atomic
/// read-modify-write on a cold line: setting all 20 of a thousand engines
/// twice a second was ~3 % of the agent's CPU samples), and all of them
/// every [`GAUGE_REFRESH`].
#[derive(Debug, Default)]
pub struct EngineGauges {
    engines: HashMap<Arc<str>, Gauges>,
    /// When every gauge was last set (None: never).
    refreshed: Option<Instant>,
}

#[derive(Debug)]
struct Gauges {
    fields: Vec<Kept>,
    /// Registered only once the engine reports KV blocks.
    gpu_kv_used_frac: Option<Kept>,
    heartbeat_age: Kept,
    capture_age: Kept,
    status: [Kept; STATUSES.len()],
}

/// A gauge and the value it was last set to: set again only when the value
/// changed, or when `refresh` asks for it.
#[derive(Debug)]
struct Kept {
    gauge: Gauge,
    value: f64,
}

impl Kept {
    fn new(gauge: Gauge) -> Kept {
        // NaN equals nothing: the first `set` always goes through.
        Kept {
            gauge,
            value: f64::NAN,
        }
    }

    fn set(&mut self, value: f64, refresh: bool) {
        if refresh || value != self.value {
            self.gauge.set(value);
            self.value = value;
        }
    }
}

impl Gauges {
    fn new(id: &str) -> Gauges {
        let id = id.to_owned();
        Gauges {
            fields: Snapshot::FIELD_NAMES
                .iter()
                .map(|name| {
                    Kept::new(metrics::gauge!(format!("engine_state_{name}"), "engine" => id.clone()))
                })
                .collect(),
            gpu_kv_used_frac: None,
            heartbeat_age: Kept::new(
                metrics::gauge!("engine_state_heartbeat_age_seconds", "engine" => id.clone()),
            ),
            capture_age: Kept::new(
                metrics::gauge!("engine_state_capture_age_seconds", "engine" => id.clone()),
            ),
            status: STATUSES.map(|status| {
                Kept::new(
                    metrics::gauge!("engine_state_status", "engine" => id.clone(), "status" => status.as_str()),
                )
            }),
        }
    }
}

impl EngineGauges {
    /// Sets the per-engine gauges from one reading taken at `now`.
    pub fn record(&mut self, reading: &Reading, redis_connected: bool, now: Instant) {
        let refresh = self
            .refreshed
            .is_none_or(|t| now.duration_since(t) >= GAUGE_REFRESH);
        if refresh {
            self.refreshed = Some(now);
        }
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
            for (gauge, value) in gauges.fields.iter_mut().zip(engine.snapshot.to_words()) {
                gauge.set(value as f64, refresh);
            }
            for (gauge, status) in gauges.status.iter_mut().zip(STATUSES) {
                gauge.set(f64::from(u8::from(engine.status == status)), refresh);
            }
            match engine.gpu_kv_used_frac() {
                Some(frac) => gauges
                    .gpu_kv_used_frac
                    .get_or_insert_with(|| {
                        Kept::new(metrics::gauge!(
                            "engine_state_gpu_kv_used_frac",
                            "engine" => engine.engine_id.to_string()
                        ))
                    })
                    .set(frac, refresh),
                // No KV blocks (yet): the gauge idles out; a handle kept past
                // that would no longer be exported, so register it anew then.
                None => gauges.gpu_kv_used_frac = None,
            }
            gauges
                .heartbeat_age
                .set(millis(engine.heartbeat_age) / 1000.0, refresh);
            gauges
                .capture_age
                .set(millis(engine.capture_age) / 1000.0, refresh);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine_state_reader::EngineState;

    fn engine(id: &str, status: Status, running: u64, free: u64) -> EngineState {
        EngineState {
            engine_id: Arc::from(id),
            status,
            snapshot: Snapshot {
                num_running: running,
                gpu_blocks_total: 100,
                gpu_blocks_free: free,
                ..Snapshot::default()
            },
            heartbeat_age: Duration::from_millis(20),
            capture_age: Duration::from_millis(30),
            generation: 1,
            read_mono_ns: 0,
        }
    }

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok())?
        })
    }

    #[test]
    fn gauges_follow_changes_between_refreshes() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let mut gauges = EngineGauges::default();
            let t0 = Instant::now();
            let mut reading = Reading {
                engines: vec![engine("a", Status::Fresh, 1, 75)],
                ..Reading::default()
            };
            gauges.record(&reading, true, t0);
            let text = handle.render();
            assert_eq!(
                value(&text, r#"engine_state_num_running{engine="a"}"#),
                Some(1.0)
            );
            assert_eq!(
                value(&text, r#"engine_state_gpu_kv_used_frac{engine="a"}"#),
                Some(0.25)
            );

            // Well before the next refresh: what changed is set, the rest kept.
            reading.engines = vec![engine("a", Status::Dead, 4, 50)];
            gauges.record(&reading, false, t0 + Duration::from_millis(500));
            let text = handle.render();
            for (series, expected) in [
                (r#"engine_state_num_running{engine="a"}"#, 4.0),
                (r#"engine_state_gpu_blocks_total{engine="a"}"#, 100.0),
                (r#"engine_state_gpu_kv_used_frac{engine="a"}"#, 0.5),
                (r#"engine_state_status{engine="a",status="dead"}"#, 1.0),
                (r#"engine_state_status{engine="a",status="fresh"}"#, 0.0),
                ("engine_state_redis_connected", 0.0),
            ] {
                assert_eq!(value(&text, series), Some(expected), "{series}\n{text}");
            }
        });
    }
}
