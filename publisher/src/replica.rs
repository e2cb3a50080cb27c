//! A router replica's shared reservations (docs/FORMAT.md, "Shared
//! reservations"; docs/ROUTING.md, "Shared reservations"): the replica's
//! file in `<dir>.routers` and the heartbeat thread that stamps it and puts
//! it back when another process removed it. The router hands it every
//! change through [`ReservationSink`]: a seqlock write of the changed words
//! under the router's lock.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use engine_state_redis::StateUri;
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

    fn failed(&self, error: &engine_state_shm_format::Error) {
        // Relaxed: counters read by monitoring only.
        self.errors.fetch_add(1, Ordering::Relaxed);
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
    writer: Arc<Mutex<RouterFileWriter>>,
    path: PathBuf,
    heartbeat: Option<HeartbeatThread>,
    stats: Arc<ReplicaStats>,
}

impl ReplicaPublisher {
    /// Starts publishing replica `replica_id`'s reservations at `uri` (the
    /// engines' URI: on shared memory the file is
    /// `<dir>.routers/<replica_id>`; the state directory is created when
    /// missing). Fails when another live process publishes the same
    /// replica id.
    pub fn start(
        uri: &StateUri,
        replica_id: &EngineId,
        options: ReplicaOptions,
    ) -> Result<ReplicaPublisher, Error> {
        let dir = match uri {
            StateUri::Shm { dir } => dir,
            StateUri::Redis { .. } => {
                return Err(Error::Config {
                    what: "shared reservations over Redis are not available in this build yet; \
                           use a file:// URI (routers on one host)"
                        .to_owned(),
                })
            }
        };
        create_dir(dir)?;
        let writer_options = RouterWriterOptions {
            mode: options.file_mode,
            heartbeat_period: options.heartbeat_period,
            ..RouterWriterOptions::default()
        };
        let writer = RouterFileWriter::create(dir, replica_id, &writer_options)?;
        let path = writer.path().to_owned();
        let writer = Arc::new(Mutex::new(writer));
        let stats = Arc::new(ReplicaStats::default());
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
        Ok(ReplicaPublisher {
            replica_id: replica_id.clone(),
            writer,
            path,
            heartbeat: Some(heartbeat),
            stats,
        })
    }

    /// The replica id.
    pub fn replica_id(&self) -> &str {
        self.replica_id.as_str()
    }

    /// The replica's file.
    pub fn path(&self) -> &Path {
        &self.path
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
        match lock(&self.writer).set(engine_id, counters) {
            Ok(()) => {
                self.stats.published.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => self.stats.failed(&error),
        }
    }

    /// Removes `engine_id` from the record (the router no longer routes to it).
    pub fn remove(&self, engine_id: &str) {
        match lock(&self.writer).remove(engine_id) {
            Ok(_) => {
                self.stats.published.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => self.stats.failed(&error),
        }
    }

    /// Stops the heartbeat, retires and removes the file. Idempotent.
    pub fn close(&mut self) {
        if let Some(heartbeat) = self.heartbeat.take() {
            heartbeat.stop();
        }
        lock(&self.writer).retire();
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
}

impl Drop for ReplicaPublisher {
    fn drop(&mut self) {
        self.close();
    }
}

/// The writer, whoever panicked while holding it: its state is still
/// consistent (every write is one seqlock write).
fn lock(writer: &Mutex<RouterFileWriter>) -> std::sync::MutexGuard<'_, RouterFileWriter> {
    writer.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
#[path = "replica_tests.rs"]
mod tests;
