//! Router replicas' reservations on Redis: every replica of one key prefix
//! (`<prefix>routers`, `<prefix>router:<id>`; docs/REDIS.md), one round trip
//! per read. The protocol (registry scan, pipelined fetch, the heartbeat's
//! age by the server's clock, pruning) is `engine_state_redis::RedisReplicas`'s;
//! this file judges what it saw by the engines' rule.

use std::sync::Arc;
use std::time::Instant;

use engine_state_redis::{RedisReplicas, RedisTarget};
use engine_state_shm_format::monotonic_ns;

use super::{replica_status, ReplicaEvidence, ReplicaReading, ReplicaSource, ReplicaState};
use crate::error::{EngineError, Error};
use crate::source::ReaderOptions;

/// Every replica under one key prefix but the reader's own.
#[derive(Debug)]
pub struct RedisReplicaSource {
    replicas: RedisReplicas,
    own: Option<String>,
    options: ReaderOptions,
}

impl RedisReplicaSource {
    /// Connects and reads once; connection and authentication failures are
    /// errors here.
    pub fn open(
        target: RedisTarget,
        own: Option<&str>,
        options: ReaderOptions,
    ) -> Result<RedisReplicaSource, Error> {
        let mut replicas = RedisReplicas::open(target)?;
        replicas.set_rescan_interval(options.rescan_interval);
        Ok(RedisReplicaSource {
            replicas,
            own: own.map(str::to_owned),
            options,
        })
    }
}

impl ReplicaSource for RedisReplicaSource {
    fn read_into(&mut self, out: &mut ReplicaReading) -> Result<(), Error> {
        out.clear();
        let now_ns = monotonic_ns();
        let read = self.replicas.read(Instant::now())?;
        for (id, value) in read.replicas {
            if self.own.as_deref() == Some(&*id) {
                continue;
            }
            match value {
                Ok(seen) => {
                    let value = seen.value;
                    let status = replica_status(
                        &self.options,
                        ReplicaEvidence {
                            torn: false,
                            retired: value.is_retired(),
                            // Another host's process: the heartbeat alone decides.
                            writer_alive: None,
                            heartbeat_age: seen.heartbeat_age,
                            clock_ahead: false,
                        },
                    );
                    out.replicas.push(ReplicaState {
                        replica_id: id,
                        status,
                        heartbeat_age: seen.heartbeat_age,
                        changed_age: None,
                        generation: value.generation,
                        read_mono_ns: now_ns,
                        writer_pid: value.writer_pid,
                        engines: value
                            .engines
                            .into_iter()
                            .map(|(engine, counters)| (Arc::from(engine.as_str()), counters))
                            .collect(),
                    });
                }
                Err(error) => out.errors.push(EngineError::new(&*id, error)),
            }
        }
        if let Some(error) = read.invalid_members {
            out.errors.push(EngineError::new(self.uri(), error));
        }
        Ok(())
    }

    fn uri(&self) -> String {
        self.replicas.target().to_string()
    }
}
