//! A router replica's shared reservations (docs/FORMAT.md, "Shared
//! reservations"; docs/ROUTING.md, "Shared reservations"). On shared
//! memory: the replica's file in `<dir>.routers` and the heartbeat thread
//! that stamps it and puts it back when another process removed it; the
//! router hands it every change through [`ReservationSink`], a seqlock
//! write of the changed words under the router's lock. On Redis:
//! `engine_state_redis::ReplicaSink`, whose thread writes the replica's
//! value batched (on change, at most every 5 ms; every heartbeat period
//! otherwise), owner-checked (docs/REDIS.md).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use engine_state_redis::{ReplicaSink, ReplicaSinkOptions, StateUri};
use engine_state_router::{ReservationSink, ShadowCounters};
use engine_state_shm_format::{EngineId, Reservations, RouterFileWriter, RouterWriterOptions};

use crate::config::DEFAULT_PERIOD;
use crate::error::Error;
use crate::heartbeat::{HeartbeatThread, Ticks};
use crate::shm_backend::create_dir;

/// How a [`ReplicaPublisher`] publishes.
#[derive(Clone, Copy, Debug)]
pub struct ReplicaOptions {
    /// The heartbeat period (default 50 ms, an engine's): readers judge the
    /// replica stale after the engines' `stale_after` without a beat.
    pub heartbeat_period: Duration,
    /// Permission bits of the shared-memory file (default 0600; 0644 when
    /// the other routers run as another user).
    pub file_mode: u32,
}

impl Default for ReplicaOptions {
    fn default() -> Self {
        ReplicaOptions {
            heartbeat_period: DEFAULT_PERIOD,
            file_mode: engine_state_shm_format::DEFAULT_FILE_MODE,
        }
    }
}

/// What a replica publisher did, for metrics and tests. Shared with the
/// publisher (a router owns the publisher once it is its sink).
#[derive(Debug, Default)]
pub struct ReplicaStats {
    published: AtomicU64,
    errors: AtomicU64,
    recreated: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl ReplicaStats {
    /// Changes written.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }

    /// Changes that could not be written (an engine id that is not one,
    /// more engines than the file holds): see [`ReplicaStats::last_error`].
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Times the file was put back after another process removed or
    /// damaged it.
    pub fn recreated(&self) -> u64 {
        self.recreated.load(Ordering::Relaxed)
    }

    /// The last error's message, if any.
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Counts `error` and keeps its message; the first one is also logged
    /// (to stderr: a router that installs no logger still sees it), the
    /// rest only counted.
    fn failed(&self, error: &engine_state_shm_format::Error) {
        // Relaxed: counters read by monitoring only.
        if self.errors.fetch_add(1, Ordering::Relaxed) == 0 {
            eprintln!(
                "engine-state: a router replica's reservations could not be published: {error}; \
                 routing goes on, its peers do not see this change (further errors are counted \
                 in ReplicaStats, not logged)"
            );
        }
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(error.to_string());
    }
}

/// One router replica's publisher of its own reservations, per engine.
///
/// Give it to the router as its sink (`Router::set_reservation_sink`): from
/// then on every reservation, `prefill_done`, release and migration is
/// published. Dropping it (or [`ReplicaPublisher::close`]) retires and
/// removes the file, so the peers drop this replica's reservations at their
/// next read; a replica killed without closing drops out once its
/// heartbeat is older than the readers' `stale_after` (or at once, where
/// the reader can see its process is gone).
///
/// ```
/// use engine_state_publisher::{ReplicaOptions, ReplicaPublisher};
/// use engine_state_router::{Request, Router, RouterSettings};
/// use engine_state_shm_format::EngineId;
///
/// let dir = tempfile::tempdir()?;
/// let uri = engine_state_redis::StateUri::parse(&format!("file://{}", dir.path().display()))?;
/// let publisher = ReplicaPublisher::start(&uri, &EngineId::new("router-a")?, ReplicaOptions::default())?;
/// let stats = publisher.stats();
/// let router = Router::with_instances(RouterSettings::default(), ["engine-0"])?;
/// router.set_reservation_sink(Some(Box::new(publisher)));
/// let (_decision, reservation) = router.pick(&Request::from_tokens("r1", vec![1; 1000]))?;
/// assert_eq!(stats.published(), 2); // the sink's first publish, then the pick
/// drop(reservation);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct ReplicaPublisher {
    replica_id: EngineId,
    backend: Backend,
    stats: Arc<ReplicaStats>,
}

#[derive(Debug)]
enum Backend {
    Shm {
        writer: Arc<Mutex<RouterFileWriter>>,
        path: PathBuf,
        heartbeat: Option<HeartbeatThread>,
    },
    Redis(ReplicaSink),
}

impl ReplicaPublisher {
    /// Starts publishing replica `replica_id`'s reservations at `uri` (the
    /// engines' URI: on shared memory the file is
    /// `<dir>.routers/<replica_id>`; the state directory is created when
    /// missing; on Redis the key `<prefix>router:<replica_id>`). Fails when
    /// another live process publishes the same replica id, and on Redis for
    /// bad credentials (an unreachable server is not an error: the sink
    /// connects with backoff and claims the key with its first write).
    pub fn start(
        uri: &StateUri,
        replica_id: &EngineId,
        options: ReplicaOptions,
    ) -> Result<ReplicaPublisher, Error> {
        let stats = Arc::new(ReplicaStats::default());
        let backend = match uri {
            StateUri::Shm { dir } => start_shm(dir, replica_id, options, &stats)?,
            StateUri::Redis { target } => {
                let sink_options = ReplicaSinkOptions {
                    heartbeat_period: options.heartbeat_period,
                    ..ReplicaSinkOptions::default()
                };
                Backend::Redis(
                    ReplicaSink::start(target.clone(), replica_id, sink_options)
                        .map_err(Error::Redis)?,
                )
            }
        };
        Ok(ReplicaPublisher {
            replica_id: replica_id.clone(),
            backend,
            stats,
        })
    }

    /// The replica id.
    pub fn replica_id(&self) -> &str {
        self.replica_id.as_str()
    }

    /// The replica's file (shared memory; `None` on Redis).
    pub fn path(&self) -> Option<&Path> {
        match &self.backend {
            Backend::Shm { path, .. } => Some(path),
            Backend::Redis(_) => None,
        }
    }

    /// The Redis sink's counters (`None` on shared memory).
    pub fn redis_stats(&self) -> Option<&engine_state_redis::SinkStats> {
        match &self.backend {
            Backend::Shm { .. } => None,
            Backend::Redis(sink) => Some(sink.stats()),
        }
    }

    /// Waits until every change so far is written, at most `timeout` (Redis:
    /// the sink thread's writes; shared memory writes at once: true).
    pub fn flush(&self, timeout: Duration) -> bool {
        match &self.backend {
            Backend::Shm { .. } => true,
            Backend::Redis(sink) => sink.flush(timeout),
        }
    }

    /// Its counters, shared: keep a handle before giving the publisher to
    /// the router.
    pub fn stats(&self) -> Arc<ReplicaStats> {
        self.stats.clone()
    }

    /// Publishes this replica's reservations on `engine_id`. An error (an
    /// invalid engine id, more engines than the file holds, a closed
    /// publisher) is counted in [`ReplicaStats`], never raised: the router
    /// calls this under its lock, and routing goes on without sharing.
    #[inline]
    pub fn set(&self, engine_id: &str, counters: &Reservations) {
        let done = match &self.backend {
            Backend::Shm { writer, .. } => lock(writer).set(engine_id, counters),
            Backend::Redis(sink) => sink.set(engine_id, counters),
        };
        match done {
            Ok(()) => {
                self.stats.published.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => self.stats.failed(&error),
        }
    }

    /// Removes `engine_id` from the record (the router no longer routes to it).
    pub fn remove(&self, engine_id: &str) {
        let done = match &self.backend {
            Backend::Shm { writer, .. } => lock(writer).remove(engine_id).map(drop),
            Backend::Redis(sink) => {
                sink.remove(engine_id);
                Ok(())
            }
        };
        match done {
            Ok(()) => {
                self.stats.published.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => self.stats.failed(&error),
        }
    }

    /// Stops the heartbeat, retires and removes the file (Redis: deletes
    /// the replica's key, owner-checked). Idempotent.
    pub fn close(&mut self) {
        match &mut self.backend {
            Backend::Shm {
                writer, heartbeat, ..
            } => {
                if let Some(heartbeat) = heartbeat.take() {
                    heartbeat.stop();
                }
                lock(writer).retire();
            }
            Backend::Redis(sink) => sink.close(),
        }
    }
}

impl ReservationSink for ReplicaPublisher {
    #[inline]
    fn reservations_changed(&mut self, instance_id: &str, counters: &ShadowCounters) {
        self.set(instance_id, counters);
    }

    fn instance_removed(&mut self, instance_id: &str) {
        self.remove(instance_id);
    }

    fn replica_id(&self) -> Option<&str> {
        Some(self.replica_id.as_str())
    }
}

impl Drop for ReplicaPublisher {
    fn drop(&mut self) {
        self.close();
    }
}

/// The shared-memory backend: the replica's file and its heartbeat thread.
fn start_shm(
    dir: &Path,
    replica_id: &EngineId,
    options: ReplicaOptions,
    stats: &Arc<ReplicaStats>,
) -> Result<Backend, Error> {
    create_dir(dir)?;
    let writer_options = RouterWriterOptions {
        mode: options.file_mode,
        heartbeat_period: options.heartbeat_period,
        ..RouterWriterOptions::default()
    };
    let writer = RouterFileWriter::create(dir, replica_id, &writer_options)?;
    let path = writer.path().to_owned();
    let writer = Arc::new(Mutex::new(writer));
    let heartbeat = {
        let writer = writer.clone();
        let stats = stats.clone();
        let mut beat = lock(&writer).heartbeat();
        let mut ticks = 0u64;
        HeartbeatThread::spawn(
            move || {
                ticks += 1;
                // One `lstat` every 20 beats (a second at 50 ms): a file
                // another process removed or damaged is put back.
                if ticks % 20 == 0 && !beat.in_place() {
                    let mut writer = lock(&writer);
                    match writer.replace() {
                        Ok(()) => {
                            stats.recreated.fetch_add(1, Ordering::Relaxed);
                            beat = writer.heartbeat();
                        }
                        Err(error) => stats.failed(&error),
                    }
                }
                beat.beat()
            },
            Ticks::Every(options.heartbeat_period),
            replica_id,
        )?
    };
    Ok(Backend::Shm {
        writer,
        path,
        heartbeat: Some(heartbeat),
    })
}

/// The writer, whoever panicked while holding it: its state is still
/// consistent (every write is one seqlock write).
fn lock(writer: &Mutex<RouterFileWriter>) -> std::sync::MutexGuard<'_, RouterFileWriter> {
    writer.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
#[path = "replica_tests.rs"]
mod tests;
