//! What a reader returns per engine.

use std::sync::Arc;
use std::time::Duration;

use engine_state_shm_format::{CacheDigest, Snapshot, FIELD_COUNT};
use serde::ser::{Serialize, SerializeMap, Serializer};

use crate::error::EngineError;
use crate::freshness::Status;

/// One engine's state as a reader saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineState {
    /// The engine id (file name / key suffix).
    pub engine_id: Arc<str>,
    /// Whether the state may be used ([`Status::Fresh`]) or not.
    pub status: Status,
    /// The snapshot (all zero when [`Status::Torn`]).
    pub snapshot: Snapshot,
    /// Time since the writer's last heartbeat.
    pub heartbeat_age: Duration,
    /// Time since the snapshot was captured.
    pub capture_age: Duration,
    /// The generation of the writer's file or key (a restart makes a new one).
    pub generation: u64,
    /// `CLOCK_MONOTONIC` (nanoseconds, the clock of `captured_mono_ns`) when
    /// this state was read: both ages are as of then. A consumer that uses the
    /// state later ages it from here (the router does: docs/ROUTING.md, "The
    /// merge"), so an old reading handed over late is already old.
    pub read_mono_ns: u64,
    /// Who wrote it, and the writer's heartbeat stamp as read: what a relay
    /// forwards (docs/REDIS.md, "The node agent").
    pub writer: Writer,
    /// A stamp of the writer (its heartbeat, or the snapshot's capture) is
    /// more than [`crate::max_ahead`] ahead of this reader's clock: its ages
    /// cannot be told, so the status is [`Status::Stale`] (and a
    /// shared-memory read reports `Error::ClockAhead` for it). A relay must
    /// not keep such an engine alive elsewhere.
    pub clock_ahead: bool,
    /// The engine's cache digest, which 512-token prefix blocks it holds
    /// (docs/FORMAT.md, "Cache residency"): present when the reader reads
    /// digests and the engine publishes one, shared between reads until its
    /// version moves. Use it only while the state is fresh.
    pub cache: Option<Arc<CacheDigest>>,
}

// What every read copies per engine (the read path's cost moves with it):
// 232 bytes on 64-bit targets: 24 for the relay's stamps (`writer`,
// `clock_ahead`), 8 for the cache digest's pointer (BENCHMARKS.md).
#[cfg(target_pointer_width = "64")]
const _: () = assert!(core::mem::size_of::<EngineState>() == 232);

/// The writer of an engine's state as a read saw it: the facts of its file
/// header (or Redis record) and its heartbeat stamp. Made for the relay,
/// which forwards shared-memory states: on Redis `created_unix_ns` is 0 and
/// the stamp is on another host's clock (the run is then `generation`); the
/// simulator's writer is pid 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Writer {
    /// The writer's process id on its host (0: unknown).
    pub pid: u32,
    /// The writer's publish period, in µs.
    pub publish_period_us: u32,
    /// `CLOCK_REALTIME` when the writer created its file, in ns since 1970
    /// (shared memory; 0 for a Redis record, which has no file).
    pub created_unix_ns: u64,
    /// The writer's heartbeat stamp (`heartbeat_mono_ns`, the writer's
    /// `CLOCK_MONOTONIC`) as read: on shared memory the stamp behind
    /// `heartbeat_age`; in a Redis record on the writer's host's clock.
    pub heartbeat_mono_ns: u64,
}

impl EngineState {
    /// `1 - free / total`, `None` when the engine reported no KV blocks.
    pub fn gpu_kv_used_frac(&self) -> Option<f64> {
        self.snapshot.gpu_kv_used_frac()
    }

    /// Only fresh state enters the `max(shadow, real)` merge.
    pub fn is_fresh(&self) -> bool {
        self.status == Status::Fresh
    }
}

/// The keys of one engine's JSON object (`esdump --json`, the Python `Reader`):
/// `engine_id`, the snapshot fields (docs/FORMAT.md, "Snapshot words"),
/// `status`, `heartbeat_age_ms`, `capture_age_ms`, `gpu_kv_used_frac`.
pub const JSON_KEYS: [&str; FIELD_COUNT + 5] = {
    // Built from the snapshot's own field names, so the two lists cannot drift.
    let mut keys = [""; FIELD_COUNT + 5];
    keys[0] = "engine_id";
    let mut i = 0;
    while i < Snapshot::FIELD_NAMES.len() {
        keys[i + 1] = Snapshot::FIELD_NAMES[i];
        i += 1;
    }
    keys[FIELD_COUNT + 1] = "status";
    keys[FIELD_COUNT + 2] = "heartbeat_age_ms";
    keys[FIELD_COUNT + 3] = "capture_age_ms";
    keys[FIELD_COUNT + 4] = "gpu_kv_used_frac";
    keys
};

/// A duration in milliseconds with microsecond resolution.
pub fn millis(d: Duration) -> f64 {
    (d.as_micros() as f64) / 1000.0
}

impl Serialize for EngineState {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(JSON_KEYS.len()))?;
        map.serialize_entry("engine_id", &*self.engine_id)?;
        let words = self.snapshot.to_words();
        for (name, value) in Snapshot::FIELD_NAMES.iter().zip(words) {
            map.serialize_entry(name, &value)?;
        }
        map.serialize_entry("status", &self.status)?;
        map.serialize_entry("heartbeat_age_ms", &millis(self.heartbeat_age))?;
        map.serialize_entry("capture_age_ms", &millis(self.capture_age))?;
        map.serialize_entry("gpu_kv_used_frac", &self.gpu_kv_used_frac())?;
        map.end()
    }
}

/// Everything one read of a source produced: the engines (sorted by id) and
/// the per-engine errors (bad files, foreign keys), which never stop the
/// other engines from being read.
#[derive(Clone, Debug, Default)]
pub struct Reading {
    /// Readable engines, sorted by id.
    pub engines: Vec<EngineState>,
    /// Engines (or foreign entries) that could not be read, with the reason.
    pub errors: Vec<EngineError>,
}

impl Reading {
    /// Empties both lists, keeping their allocations.
    pub fn clear(&mut self) {
        self.engines.clear();
        self.errors.clear();
    }

    /// The engine with this id, if it was read.
    pub fn get(&self, engine_id: &str) -> Option<&EngineState> {
        self.engines
            .binary_search_by(|e| (*e.engine_id).cmp(engine_id))
            .ok()
            .map(|i| &self.engines[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_exactly_the_contract_keys() {
        let state = EngineState {
            engine_id: "e0".into(),
            status: Status::Fresh,
            snapshot: Snapshot {
                num_running: 4,
                gpu_blocks_total: 10,
                gpu_blocks_free: 4,
                ..Default::default()
            },
            heartbeat_age: Duration::from_micros(1500),
            capture_age: Duration::from_millis(20),
            generation: 1,
            read_mono_ns: 0,
            writer: Writer::default(),
            clock_ahead: false,
            cache: None,
        };
        let value = serde_json::to_value(&state).unwrap();
        let object = value.as_object().unwrap();
        let keys: Vec<&str> = object.keys().map(String::as_str).collect();
        let mut expected = JSON_KEYS.to_vec();
        expected.sort_unstable();
        let mut got = keys.clone();
        got.sort_unstable();
        assert_eq!(got, expected);
        assert_eq!(object["engine_id"], "e0");
        assert_eq!(object["status"], "fresh");
        assert_eq!(object["num_running"], 4);
        assert_eq!(object["heartbeat_age_ms"], 1.5);
        assert!((object["gpu_kv_used_frac"].as_f64().unwrap() - 0.6).abs() < 1e-12);
        let empty = EngineState {
            snapshot: Snapshot::default(),
            ..state
        };
        assert!(serde_json::to_value(&empty).unwrap()["gpu_kv_used_frac"].is_null());
    }
}
