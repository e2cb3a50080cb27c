//! Reading router replicas' shared reservations (docs/FORMAT.md, "Shared
//! reservations"): every peer replica's record, judged by the engines'
//! staleness rule, for a router to merge (`Router::update_from_replicas`).
//! The shared-memory source is `replicas/shm.rs`; Redis, `replicas/redis.rs`.
//!
//! A replica's record is never about load the reader itself holds: the
//! reader's own replica id is left out of every read, so a router that both
//! publishes and reads never counts its own reservations twice.

#[cfg(feature = "redis")]
mod redis;
mod shm;

use std::sync::Arc;
use std::time::Duration;

use engine_state_shm_format::Reservations;
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

use crate::error::{EngineError, Error};
use crate::freshness::{Evidence, Status};
use crate::source::ReaderOptions;
use crate::state::millis;
use crate::uri::StateUri;

#[cfg(feature = "redis")]
pub use self::redis::RedisReplicaSource;
pub use self::shm::ShmReplicas;

/// One peer replica's reservations as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaState {
    /// The replica id (file name, key suffix).
    pub replica_id: Arc<str>,
    /// Only [`Status::Fresh`] reservations are merged by a router.
    pub status: Status,
    /// How old the replica's heartbeat was at the read.
    pub heartbeat_age: Duration,
    /// How long ago the replica last changed its reservations (its writer's
    /// clock; `None` when unknown: a Redis record of another host).
    pub changed_age: Option<Duration>,
    /// The generation of its file or key (a restarted router's is higher).
    pub generation: u64,
    /// `CLOCK_MONOTONIC` ns of the read: the ages are as of then.
    pub read_mono_ns: u64,
    /// Its writer's pid on its host (display only).
    pub writer_pid: u32,
    /// Its reservations per engine, in the writer's slot order (each engine
    /// once). Empty when torn.
    pub engines: Vec<(Arc<str>, Reservations)>,
}

impl ReplicaState {
    /// The sum of its reservations over every engine.
    pub fn total_requests(&self) -> u64 {
        self.engines.iter().map(|(_, r)| r.num_requests).sum()
    }
}

impl Serialize for ReplicaState {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("replica_id", &*self.replica_id)?;
        map.serialize_entry("status", &self.status)?;
        map.serialize_entry("heartbeat_age_ms", &millis(self.heartbeat_age))?;
        map.serialize_entry("changed_age_ms", &self.changed_age.map(millis))?;
        map.serialize_entry("generation", &self.generation)?;
        map.serialize_entry("writer_pid", &self.writer_pid)?;
        let engines: serde_json::Map<String, serde_json::Value> = self
            .engines
            .iter()
            .map(|(id, r)| {
                let fields = r
                    .fields()
                    .map(|(name, value)| (name.to_owned(), value.into()))
                    .collect();
                (id.to_string(), serde_json::Value::Object(fields))
            })
            .collect();
        map.serialize_entry("engines", &engines)?;
        map.end()
    }
}

/// Everything one read of the replicas produced: the replicas (sorted by
/// id) and the per-replica errors (bad files, foreign keys), which never
/// stop the other replicas from being read.
#[derive(Clone, Debug, Default)]
pub struct ReplicaReading {
    /// Readable replicas, sorted by id, the reader's own left out.
    pub replicas: Vec<ReplicaState>,
    /// Replicas (or foreign entries) that could not be read, with the
    /// reason: `name` is the replica id (or the entry's name).
    pub errors: Vec<EngineError>,
}

impl ReplicaReading {
    /// Empties both lists, keeping their allocations.
    pub fn clear(&mut self) {
        self.replicas.clear();
        self.errors.clear();
    }

    /// The replica with this id, if it was read.
    pub fn get(&self, replica_id: &str) -> Option<&ReplicaState> {
        self.replicas
            .binary_search_by(|r| (*r.replica_id).cmp(replica_id))
            .ok()
            .map(|i| &self.replicas[i])
    }
}

/// A place router replicas publish their reservations into.
pub trait ReplicaSource: Send {
    /// Reads every replica but the reader's own into `out` (cleared
    /// first). An error here concerns the whole source; one replica's
    /// trouble goes into `out.errors`.
    fn read_into(&mut self, out: &mut ReplicaReading) -> Result<(), Error>;

    /// Reads every replica but the reader's own.
    fn read(&mut self) -> Result<ReplicaReading, Error> {
        let mut out = ReplicaReading::default();
        self.read_into(&mut out)?;
        Ok(out)
    }

    /// The source's URI, passwords hidden.
    fn uri(&self) -> String;
}

/// Opens the replicas' reservations at the place `uri` names (the same URI
/// the engines publish to: on shared memory the replicas' directory is
/// `<dir>.routers`), leaving out `own_replica_id` (the reading router's
/// own, if it publishes too).
pub fn open_replicas(
    uri: &StateUri,
    own_replica_id: Option<&str>,
    options: ReaderOptions,
) -> Result<Box<dyn ReplicaSource>, Error> {
    match uri {
        StateUri::Shm { dir } => Ok(Box::new(ShmReplicas::open(dir, own_replica_id, options)?)),
        #[cfg(feature = "redis")]
        StateUri::Redis { target } => Ok(Box::new(RedisReplicaSource::open(
            target.clone(),
            own_replica_id,
            options,
        )?)),
        #[cfg(not(feature = "redis"))]
        StateUri::Redis { target } => match *target {},
    }
}

/// The status of a replica's record: the engines' rule
/// (`Freshness::classify`) with no capture age — a replica publishes only
/// when its reservations change, and its heartbeat says it is alive.
pub(crate) fn replica_status(options: &ReaderOptions, evidence: ReplicaEvidence) -> Status {
    options.freshness.classify(&Evidence {
        torn: evidence.torn,
        retired: evidence.retired,
        writer_alive: evidence.writer_alive,
        heartbeat_age: evidence.heartbeat_age,
        capture_age: Duration::ZERO,
        idle: true,
        clock_ahead: evidence.clock_ahead,
    })
}

/// What a source saw of one replica, for [`replica_status`].
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ReplicaEvidence {
    pub torn: bool,
    pub retired: bool,
    pub writer_alive: Option<bool>,
    pub heartbeat_age: Duration,
    pub clock_ahead: bool,
}

#[cfg(test)]
#[path = "replicas_tests.rs"]
mod tests;
