//! The agent's Prometheus metrics (names are the contract: docs/REDIS.md).
//! Every family has a `# HELP`; `_total` only on counters; stamps in seconds.
//!
//! Per engine (label `engine`): one gauge per snapshot field
//! (`engine_state_<field>`, except the renamed ones of [`FIELD_GAUGES`]:
//! `engine_state_captured_mono_seconds`,
//! `engine_state_captured_timestamp_seconds`,
//! `engine_state_gpu_blocks_usable`), `engine_state_gpu_kv_used_frac`,
//! `engine_state_heartbeat_age_seconds`, `engine_state_capture_age_seconds`
//! and `engine_state_status` (label `status`, 1 for the current one).
//! Agent-wide: histograms `engine_state_snapshot_age_seconds` (capture age of
//! each relayed record) and `engine_state_relay_lag_seconds` (engine's
//! heartbeat stamp → Redis's acknowledgement read, at the pass after the
//! write: up to one poll interval later than Redis sent it), counters
//! `engine_state_read_errors_total`, `engine_state_relay_errors_total`,
//! `engine_state_relayed_total`, `engine_state_relay_refused_total`,
//! `engine_state_registry_errors_total`, gauges `engine_state_engines` and
//! `engine_state_redis_connected`. In metrics-only mode (no Redis) the
//! relay's families (histograms, `relay*`/`registry*` counters,
//! `redis_connected`) are not exported.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine_state_reader::{millis, Reading, Status};
use engine_state_shm_format::FIELD_COUNT;
use metrics::Gauge;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};
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

/// Engine count gauge.
pub const ENGINES: &str = "engine_state_engines";
/// Redis connection gauge (relay mode only).
pub const REDIS_CONNECTED: &str = "engine_state_redis_connected";
const HEARTBEAT_AGE: &str = "engine_state_heartbeat_age_seconds";
const CAPTURE_AGE: &str = "engine_state_capture_age_seconds";
const STATUS: &str = "engine_state_status";
const GPU_KV_USED_FRAC: &str = "engine_state_gpu_kv_used_frac";

/// How a snapshot word becomes a gauge value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scale {
    /// The word as it is (counts, tokens, blocks, flags).
    Same,
    /// A nanosecond stamp, exported in seconds (a float holds a Unix stamp
    /// in ns only to 256 ns; Prometheus' base unit is the second).
    NanosToSeconds,
}

/// The gauge of each snapshot field, in word order (`Snapshot::FIELD_NAMES`,
/// which `EngineGauges::record` zips with the snapshot's words): (metric
/// name, scale, help). Each is `engine_state_<field>` but the renamed ones
/// (`renamed`): the stamps (ns → seconds) and the usable block count (a
/// gauge: `_total` is for counters).
const FIELD_GAUGES: [(&str, Scale, &str); FIELD_COUNT] = [
    (
        "engine_state_captured_mono_seconds",
        Scale::NanosToSeconds,
        "CLOCK_MONOTONIC of the host at the snapshot's capture, in seconds",
    ),
    (
        "engine_state_captured_timestamp_seconds",
        Scale::NanosToSeconds,
        "Unix time of the snapshot's capture, in seconds",
    ),
    (
        "engine_state_step",
        Scale::Same,
        "Scheduler steps seen by the engine's hook",
    ),
    ("engine_state_num_running", Scale::Same, "Running requests"),
    (
        "engine_state_num_waiting",
        Scale::Same,
        "Waiting requests (including those holding KV blocks)",
    ),
    (
        "engine_state_gpu_blocks_usable",
        Scale::Same,
        "Usable GPU KV-cache blocks (the snapshot field gpu_blocks_total)",
    ),
    (
        "engine_state_gpu_blocks_free",
        Scale::Same,
        "Free GPU KV-cache blocks (evictable cached blocks included)",
    ),
    (
        "engine_state_pending_prefill_tokens",
        Scale::Same,
        "Remaining prefill tokens of waiting and running requests",
    ),
    (
        "engine_state_ongoing_decode_tokens",
        Scale::Same,
        "Tokens of running requests whose prefill is complete",
    ),
    (
        "engine_state_num_prefilling",
        Scale::Same,
        "Running requests still prefilling",
    ),
    (
        "engine_state_max_prefill_remaining",
        Scale::Same,
        "Largest remaining prefill of any waiting or running request, in tokens",
    ),
    (
        "engine_state_num_preempted",
        Scale::Same,
        "Preempted requests",
    ),
    (
        "engine_state_flags",
        Scale::Same,
        "Snapshot flags: bit 0 idle, bit 1 shutting down",
    ),
    (
        "engine_state_cache_blocks",
        Scale::Same,
        "Router blocks in the engine's latest cache digest",
    ),
    (
        "engine_state_cache_version",
        Scale::Same,
        "Version of the engine's latest cache digest (0: it publishes none)",
    ),
];

impl Scale {
    fn apply(self, word: u64) -> f64 {
        match self {
            Scale::Same => word as f64,
            // Split so that the whole seconds are exact and the fraction
            // keeps its nanoseconds.
            Scale::NanosToSeconds => {
                (word / 1_000_000_000) as f64 + (word % 1_000_000_000) as f64 * 1e-9
            }
        }
    }
}

/// Gauges of engines that stopped being updated disappear after this long.
const GAUGE_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Between refreshes of every gauge only the changed ones are set; a
/// refresh keeps unchanged gauges from idling out.
const GAUGE_REFRESH: Duration = Duration::from_secs(10);

const STATUSES: [Status; 4] = [Status::Fresh, Status::Stale, Status::Dead, Status::Torn];

/// A new recorder for one agent, with the help of every family: each
/// [`Agent`](crate::Agent) owns one, and records into it by running its setup
/// and relay loop under `metrics::with_local_recorder`, so agents in one
/// process (tests, an embedding program) never mix their metrics and no
/// process-wide recorder is taken.
pub fn recorder() -> PrometheusRecorder {
    let buckets = [
        0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
    ];
    let recorder = PrometheusBuilder::new()
        .set_buckets(&buckets)
        .expect("non-empty bucket list")
        .idle_timeout(MetricKindMask::GAUGE, Some(GAUGE_IDLE_TIMEOUT))
        .build_recorder();
    metrics::with_local_recorder(&recorder, describe);
    recorder
}

/// Registers the counters at zero, so that they (and their help) are
/// exported before the first event: the relay's only when `relaying`.
pub fn register_counters(relaying: bool) {
    metrics::counter!(READ_ERRORS).increment(0);
    if relaying {
        for counter in [RELAY_ERRORS, RELAYED, RELAY_REFUSED, REGISTRY_ERRORS] {
            metrics::counter!(counter).increment(0);
        }
    }
}

fn describe() {
    for (name, scale, help) in FIELD_GAUGES {
        match scale {
            Scale::Same => metrics::describe_gauge!(name, help),
            Scale::NanosToSeconds => metrics::describe_gauge!(name, metrics::Unit::Seconds, help),
        }
    }
    metrics::describe_gauge!(ENGINES, "Engines in the shared-memory directory");
    metrics::describe_gauge!(
        REDIS_CONNECTED,
        "1 while the relay is connected to Redis, else 0"
    );
    metrics::describe_gauge!(
        HEARTBEAT_AGE,
        metrics::Unit::Seconds,
        "Age of the engine's last heartbeat"
    );
    metrics::describe_gauge!(
        CAPTURE_AGE,
        metrics::Unit::Seconds,
        "Age of the engine's last snapshot"
    );
    metrics::describe_gauge!(
        STATUS,
        "1 for the engine's current status (fresh, stale, dead, torn), 0 for the others"
    );
    metrics::describe_gauge!(
        GPU_KV_USED_FRAC,
        "Used fraction of the GPU KV cache: 1 - free / usable blocks"
    );
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
    fields: Vec<CachedGauge>,
    /// Registered only once the engine reports KV blocks.
    gpu_kv_used_frac: Option<CachedGauge>,
    heartbeat_age: CachedGauge,
    capture_age: CachedGauge,
    status: [CachedGauge; STATUSES.len()],
}

/// A gauge and the value it was last set to: set again only when the value
/// changed, or when `refresh` asks for it.
#[derive(Debug)]
struct CachedGauge {
    gauge: Gauge,
    value: f64,
}

impl CachedGauge {
    fn new(gauge: Gauge) -> CachedGauge {
        // NaN equals nothing: the first `set` always goes through.
        CachedGauge {
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
            fields: FIELD_GAUGES
                .iter()
                .map(|(name, _, _)| {
                    CachedGauge::new(metrics::gauge!(*name, "engine" => id.clone()))
                })
                .collect(),
            gpu_kv_used_frac: None,
            heartbeat_age: CachedGauge::new(metrics::gauge!(HEARTBEAT_AGE, "engine" => id.clone())),
            capture_age: CachedGauge::new(metrics::gauge!(CAPTURE_AGE, "engine" => id.clone())),
            status: STATUSES.map(|status| {
                CachedGauge::new(
                    metrics::gauge!(STATUS, "engine" => id.clone(), "status" => status.as_str()),
                )
            }),
        }
    }
}

impl EngineGauges {
    /// Sets the per-engine gauges from one reading taken at `now`, and
    /// whether Redis is connected (None: metrics-only mode, no gauge).
    pub fn record(&mut self, reading: &Reading, redis_connected: Option<bool>, now: Instant) {
        let refresh = self
            .refreshed
            .is_none_or(|t| now.duration_since(t) >= GAUGE_REFRESH);
        if refresh {
            self.refreshed = Some(now);
        }
        metrics::gauge!(ENGINES).set(reading.engines.len() as f64);
        if let Some(connected) = redis_connected {
            metrics::gauge!(REDIS_CONNECTED).set(f64::from(u8::from(connected)));
        }
        // Gauges of engines that left go idle and the exporter drops them;
        // a returning engine registers them again.
        self.engines.retain(|id, _| reading.get(id).is_some());
        for engine in &reading.engines {
            let gauges = self
                .engines
                .entry(engine.engine_id.clone())
                .or_insert_with(|| Gauges::new(&engine.engine_id));
            for ((gauge, (_, word)), (_, scale, _)) in gauges
                .fields
                .iter_mut()
                .zip(engine.snapshot.fields())
                .zip(FIELD_GAUGES)
            {
                gauge.set(scale.apply(word), refresh);
            }
            for (gauge, status) in gauges.status.iter_mut().zip(STATUSES) {
                gauge.set(f64::from(u8::from(engine.status == status)), refresh);
            }
            match engine.gpu_kv_used_frac() {
                Some(frac) => gauges
                    .gpu_kv_used_frac
                    .get_or_insert_with(|| {
                        CachedGauge::new(metrics::gauge!(
                            GPU_KV_USED_FRAC,
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
    use engine_state_reader::{EngineState, Snapshot};

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
            writer: Default::default(),
            clock_ahead: false,
            cache: None,
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
            gauges.record(&reading, Some(true), t0);
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
            gauges.record(&reading, Some(false), t0 + Duration::from_millis(500));
            let text = handle.render();
            for (series, expected) in [
                (r#"engine_state_num_running{engine="a"}"#, 4.0),
                (r#"engine_state_gpu_blocks_usable{engine="a"}"#, 100.0),
                (r#"engine_state_gpu_kv_used_frac{engine="a"}"#, 0.5),
                (r#"engine_state_status{engine="a",status="dead"}"#, 1.0),
                (r#"engine_state_status{engine="a",status="fresh"}"#, 0.0),
                ("engine_state_redis_connected", 0.0),
            ] {
                assert_eq!(value(&text, series), Some(expected), "{series}\n{text}");
            }
        });
    }

    #[test]
    fn field_gauges_follow_the_snapshot_fields() {
        // The families whose name is not `engine_state_<field>`.
        let renamed = [
            ("captured_mono_ns", "engine_state_captured_mono_seconds"),
            (
                "captured_unix_ns",
                "engine_state_captured_timestamp_seconds",
            ),
            ("gpu_blocks_total", "engine_state_gpu_blocks_usable"),
        ];
        for ((name, scale, _), field) in FIELD_GAUGES.iter().zip(Snapshot::FIELD_NAMES) {
            let expected = match renamed.iter().find(|(f, _)| *f == field) {
                Some((_, name)) => name.to_string(),
                None => format!("engine_state_{field}"),
            };
            assert_eq!(*name, expected, "{field}");
            assert!(!name.ends_with("_total"), "{name}: a gauge");
            assert_eq!(
                *scale == Scale::NanosToSeconds,
                field.ends_with("_ns"),
                "{field}"
            );
            assert_eq!(name.ends_with("_seconds"), field.ends_with("_ns"), "{name}");
        }
        // 2026-01-01T00:00:00.123456789Z: within a microsecond (a float of the ns would be 256 ns off before the division).
        let seconds = Scale::NanosToSeconds.apply(1_767_225_600_123_456_789);
        assert!(
            (seconds - 1_767_225_600.123_456_7).abs() < 1e-6,
            "{seconds}"
        );
    }
}
