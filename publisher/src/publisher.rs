//! The publisher: one engine's writer plus its heartbeat thread.

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use engine_state_redis::StateUri;
use engine_state_redis::{
    Claim, RecordWriter, RedisRecord, RedisSink, RedisTarget, SinkHandle, SinkOp,
};
use engine_state_shm_format::{
    fork_generation, heartbeat, monotonic_ns, unix_ns, ShmWriter, Snapshot, WriterOptions,
    FLAG_IDLE, FLAG_SHUTTING_DOWN,
};

use crate::config::PublisherConfig;
use crate::error::Error;
use crate::recreate::{Handoff, Keeper, PublisherStats};

/// The flag bits of layout version 1 (DESIGN §3); the others are reserved.
const KNOWN_FLAGS: u64 = FLAG_IDLE | FLAG_SHUTTING_DOWN;

/// How long `close()` waits for the Redis sink to delete the engine's key.
const CLOSE_FLUSH_TIMEOUT: Duration = Duration::from_secs(1);

/// Publishes one engine's snapshots.
///
/// [`Publisher::publish`] is the hot path (called on vLLM's scheduler thread):
/// it stamps the capture clocks and the idle flag and does one seqlock write,
/// with no allocation, lock or system call beyond `clock_gettime` (vDSO).
/// A native heartbeat thread stamps `heartbeat_mono_ns` every period, so an
/// idle engine, or one inside a long forward pass, still shows as alive; it
/// never touches Python. Fork-safe: in a child process `publish` returns
/// [`Error::WrongProcess`] and dropping does nothing to the parent's file.
///
/// A file removed under a live publisher (with its directory or alone) is
/// noticed by the heartbeat thread within a few periods and recreated, in a
/// new generation, as soon as the directory exists again (the directory
/// itself is not recreated); the gap is logged once on stderr and counted
/// in [`Publisher::stats`]. `publish` never fails because of it.
///
/// With a `redis://` URI the same calls fill a one-slot mailbox instead, and
/// a sink thread writes the record to Redis (DESIGN §7): `publish` never
/// waits on the network, and an outage only means older records are replaced
/// by newer ones before they are sent.
#[derive(Debug)]
pub struct Publisher {
    config: PublisherConfig,
    backend: Option<Backend>,
    heartbeat: Option<HeartbeatThread>,
    fork_generation: u64,
    owner_pid: u32,
}

#[derive(Debug)]
enum Backend {
    Shm(ShmBackend),
    Redis(RedisBackend),
}

#[derive(Debug)]
struct ShmBackend {
    writer: ShmWriter,
    /// A writer of a recreated file, from the heartbeat thread.
    handoff: Arc<Handoff>,
}

#[derive(Debug)]
struct RedisBackend {
    sink: RedisSink,
    engine_id: Arc<str>,
    /// The latest record; the heartbeat thread re-sends it with a new heartbeat.
    record: Arc<Mutex<RedisRecord>>,
}

#[derive(Debug)]
struct HeartbeatThread {
    stop: mpsc::Sender<()>,
    handle: JoinHandle<()>,
}

impl Publisher {
    /// Creates the engine's file (and its directory when missing), or for a
    /// `redis://` URI connects and starts the sink thread; then starts the
    /// heartbeat thread.
    ///
    /// A second live publisher of the same engine id is refused with
    /// [`Error::AlreadyPublished`], on either backend. Shared memory: the
    /// file's writer is alive (a dead writer's file is taken over). Redis:
    /// the engine's key holds another writer's unexpired record (one round
    /// trip, [`engine_state_redis::SET_IF_OWNER_SCRIPT`]); a restarted
    /// engine takes the id over once its predecessor's key expired
    /// (`ttl_ms`, 2 s by default, after its last write).
    ///
    /// Redis: a wrong password or missing permission is an error here; an
    /// unreachable server is not (the engine must not fail to start because
    /// telemetry is down): the sink keeps reconnecting with backoff, and
    /// its writes claim the key the same way.
    pub fn start(config: PublisherConfig) -> Result<Publisher, Error> {
        let (backend, heartbeat) = match &config.uri {
            StateUri::Shm { dir } => {
                create_dir(dir)?;
                let options = WriterOptions {
                    mode: config.file_mode,
                    publish_period: config.period,
                };
                let first = stamp(Snapshot::default());
                let writer = ShmWriter::create(dir, &config.engine_id, &options, &first)
                    .map_err(Error::from_shm)?;
                let handoff = Arc::new(Handoff::default());
                // A stamp younger than a period is a publish's: left alone.
                let mut keeper = Keeper::new(dir.clone(), &writer, options, handoff.clone());
                let heartbeat = HeartbeatThread::spawn(
                    move || keeper.tick(),
                    config.period,
                    &config.engine_id,
                )?;
                (Backend::Shm(ShmBackend { writer, handoff }), heartbeat)
            }
            StateUri::Redis { target } => {
                let target = target.clone();
                let mut connection = match target.connect() {
                    Ok(con) => Some(con),
                    Err(e) if e.is_auth_error() => return Err(Error::Redis(e)),
                    Err(_) => None,
                };
                let engine_id: Arc<str> = Arc::from(config.engine_id.as_str());
                let first = stamp(Snapshot::default());
                let writer = RecordWriter {
                    pid: std::process::id(),
                    publish_period_us: config.period.as_micros().min(u32::MAX as u128) as u32,
                    // Differs between runs; only ever compared for equality.
                    generation: unix_ns(),
                };
                let record = Arc::new(Mutex::new(RedisRecord::active(
                    writer,
                    1,
                    first.captured_mono_ns,
                    first,
                )));
                let owner = *lock(&record);
                if let Some(con) = connection.as_mut() {
                    match claim(con, &target, &engine_id, owner) {
                        Ok(()) => {}
                        Err(e @ Error::AlreadyPublished { .. }) => return Err(e),
                        Err(Error::Redis(e)) if e.is_auth_error() => return Err(Error::Redis(e)),
                        // Network trouble: the sink claims the key once it is through.
                        Err(_) => connection = None,
                    }
                }
                let sink = RedisSink::start(
                    target,
                    connection,
                    None,
                    &format!("es-redis-{}", config.engine_id),
                    Some(owner),
                )
                .map_err(|e| Error::Config {
                    what: format!("cannot start the Redis sink thread: {e}"),
                })?;
                sink.send(&engine_id, SinkOp::Set(*lock(&record)));
                let (handle, beat_record, beat_id) =
                    (sink.handle(), record.clone(), engine_id.clone());
                let period = config.period;
                let heartbeat = HeartbeatThread::spawn(
                    move || {
                        heartbeat_redis(&handle, &beat_id, &beat_record, period);
                        true
                    },
                    config.period,
                    &config.engine_id,
                )?;
                (
                    Backend::Redis(RedisBackend {
                        sink,
                        engine_id,
                        record,
                    }),
                    heartbeat,
                )
            }
        };
        Ok(Publisher {
            config,
            backend: Some(backend),
            heartbeat: Some(heartbeat),
            fork_generation: fork_generation(),
            owner_pid: std::process::id(),
        })
    }

    /// Publishes `snapshot`: `captured_mono_ns`, `captured_unix_ns` and the idle
    /// flag are set here (whatever the caller passed); the rest as given.
    ///
    /// Refused with [`Error::InvalidSnapshot`] (two comparisons): more free
    /// than total KV blocks (readers would clamp `gpu_kv_used_frac` to 0 and
    /// hide the bug), and flag bits the layout does not define.
    #[inline]
    pub fn publish(&mut self, snapshot: Snapshot) -> Result<(), Error> {
        if snapshot.gpu_blocks_free > snapshot.gpu_blocks_total
            || snapshot.flags & !KNOWN_FLAGS != 0
        {
            return Err(self.invalid(&snapshot));
        }
        let wrong_process = || Error::WrongProcess {
            engine_id: self.config.engine_id.to_string(),
            owner_pid: self.owner_pid,
        };
        match self.backend.as_mut() {
            None => Err(Error::Closed {
                engine_id: self.config.engine_id.to_string(),
            }),
            Some(Backend::Shm(shm)) => {
                if shm.handoff.is_ready() {
                    // The file was recreated (a new generation): publish there.
                    if fork_generation() != self.fork_generation {
                        return Err(wrong_process());
                    }
                    shm.handoff.adopt(&mut shm.writer);
                }
                let writer = &mut shm.writer;
                let snapshot = stamp(snapshot);
                if writer.publish(&snapshot).is_err() {
                    return Err(wrong_process());
                }
                // A publish is a sign of life too.
                writer.stamp_heartbeat(snapshot.captured_mono_ns);
                Ok(())
            }
            Some(Backend::Redis(redis)) => {
                if fork_generation() != self.fork_generation {
                    return Err(wrong_process());
                }
                let snapshot = stamp(snapshot);
                let record = {
                    let mut record = lock(&redis.record);
                    record.snapshot = snapshot;
                    record.heartbeat_seq += 1;
                    record.heartbeat_mono_ns = snapshot.captured_mono_ns;
                    *record
                };
                redis.sink.send(&redis.engine_id, SinkOp::Set(record));
                Ok(())
            }
        }
    }

    #[cold]
    fn invalid(&self, snapshot: &Snapshot) -> Error {
        let what = if snapshot.gpu_blocks_free > snapshot.gpu_blocks_total {
            format!(
                "gpu_blocks_free ({}) is above gpu_blocks_total ({}); pass the usable KV blocks \
                 of the pool as total and its free ones as free (free <= total)",
                snapshot.gpu_blocks_free, snapshot.gpu_blocks_total
            )
        } else {
            format!(
                "flags {:#x} has bits layout version 1 does not define ({:#x}); only \
                 FLAG_IDLE (1) and FLAG_SHUTTING_DOWN (2) may be set",
                snapshot.flags,
                snapshot.flags & !KNOWN_FLAGS
            )
        };
        Error::InvalidSnapshot {
            engine_id: self.config.engine_id.to_string(),
            what,
        }
    }

    /// Stops the heartbeat, retires the file and removes it. Idempotent; in a
    /// forked child it only forgets the parent's resources.
    pub fn close(&mut self) {
        if fork_generation() != self.fork_generation {
            // The heartbeat thread does not exist in a child; joining it would
            // hang, and the file is the parent's.
            if let Some(heartbeat) = self.heartbeat.take() {
                std::mem::forget(heartbeat);
            }
            match self.backend.take() {
                Some(Backend::Shm(shm)) => std::mem::forget(shm),
                Some(Backend::Redis(redis)) => redis.sink.forget(),
                None => {}
            }
            return;
        }
        if let Some(heartbeat) = self.heartbeat.take() {
            heartbeat.stop();
        }
        match self.backend.take() {
            Some(Backend::Shm(mut shm)) => {
                shm.writer.retire();
                shm.handoff.clear(); // a recreated file not published into yet
            }
            Some(Backend::Redis(mut redis)) => {
                // Like removing the file: the engine leaves the registry at once.
                redis.sink.send(&redis.engine_id, SinkOp::Delete);
                redis.sink.flush(CLOSE_FLUSH_TIMEOUT);
                redis.sink.stop();
            }
            None => {}
        }
    }

    /// False once closed.
    pub fn is_open(&self) -> bool {
        self.backend.is_some()
    }

    /// Counters of the Redis sink (None for shared memory or once closed).
    pub fn redis_stats(&self) -> Option<&engine_state_redis::SinkStats> {
        match &self.backend {
            Some(Backend::Redis(redis)) => Some(redis.sink.stats()),
            _ => None,
        }
    }

    /// Counters: files lost and recreated (shared memory; zero for Redis).
    pub fn stats(&self) -> PublisherStats {
        match &self.backend {
            Some(Backend::Shm(shm)) => shm.handoff.stats(),
            _ => PublisherStats::default(),
        }
    }

    /// The engine id.
    pub fn engine_id(&self) -> &str {
        self.config.engine_id.as_str()
    }

    /// The settings in use.
    pub fn config(&self) -> &PublisherConfig {
        &self.config
    }

    /// The file being published (None once closed, and for Redis).
    pub fn path(&self) -> Option<&Path> {
        match &self.backend {
            Some(Backend::Shm(shm)) => Some(shm.writer.path()),
            _ => None,
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.close();
    }
}

/// Sets the capture clocks and derives the idle flag from the counts.
#[inline]
fn stamp(mut snapshot: Snapshot) -> Snapshot {
    snapshot.captured_mono_ns = monotonic_ns();
    snapshot.captured_unix_ns = unix_ns();
    if snapshot.num_running == 0 && snapshot.num_waiting == 0 {
        snapshot.flags |= FLAG_IDLE;
    } else {
        snapshot.flags &= !FLAG_IDLE;
    }
    snapshot
}

fn create_dir(dir: &PathBuf) -> Result<(), Error> {
    // A missing directory that cannot be created, and something that exists
    // but is not a directory (a regular file, refused by `ShmWriter::create`)
    // are not bad settings but bad directories: I/O errors
    // (`EngineStateError` in Python, not `ValueError`).
    if dir.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(|io| Error::CreateDirectory {
        dir: dir.clone(),
        io,
    })
}

/// Writes the first record unless another live writer holds the engine's
/// key ([`engine_state_redis::claim`]).
fn claim(
    con: &mut redis::Connection,
    target: &RedisTarget,
    engine_id: &str,
    record: RedisRecord,
) -> Result<(), Error> {
    match engine_state_redis::claim(con, target, engine_id, record).map_err(Error::Redis)? {
        Claim::Written => Ok(()),
        Claim::Held { holder_pid, key } => Err(Error::AlreadyPublished {
            engine_id: engine_id.to_owned(),
            holder: format!("pid {holder_pid} on its host"),
            location: format!("Redis key {key:?} ({target})"),
            takeover: "; a restarted engine takes its id over once the old key expires \
                       (ttl_ms after the last write of its predecessor)",
        }),
    }
}

/// One Redis heartbeat: the latest record again, with the next heartbeat —
/// unless a publish sent one less than `period` ago (a busy engine's
/// publishes keep its key alive; a second write per period would not).
fn heartbeat_redis(
    sink: &SinkHandle,
    engine_id: &Arc<str>,
    record: &Mutex<RedisRecord>,
    period: Duration,
) {
    let record = {
        let mut record = lock(record);
        let now = monotonic_ns();
        if now.saturating_sub(record.heartbeat_mono_ns)
            < heartbeat::skip_if_younger(period).as_nanos() as u64
        {
            return;
        }
        record.heartbeat_seq += 1;
        record.heartbeat_mono_ns = now;
        *record
    };
    sink.send(engine_id, SinkOp::Set(record));
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl HeartbeatThread {
    /// Calls `beat` every period until it returns false or the thread is stopped.
    fn spawn(
        mut beat: impl FnMut() -> bool + Send + 'static,
        period: Duration,
        engine_id: &impl std::fmt::Display,
    ) -> Result<Self, Error> {
        let (stop, stopped) = mpsc::channel::<()>();
        let handle = std::thread::Builder::new()
            .name(
                format!("es-heartbeat-{engine_id}")
                    .chars()
                    .take(15)
                    .collect(),
            )
            .spawn(move || loop {
                match stopped.recv_timeout(period) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        if !beat() {
                            return; // retired, or the writer is gone
                        }
                    }
                    Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            })
            .map_err(|io| Error::Spawn {
                thread: "heartbeat",
                io,
            })?;
        Ok(HeartbeatThread { stop, handle })
    }

    fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.handle.join();
    }
}
