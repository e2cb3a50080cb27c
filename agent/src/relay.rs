//! The relay: queue each engine whose snapshot or heartbeat changed for the
//! Redis sink.
//!
//! Two passes, so that latency does not cost CPU: [`Relay::poll`] (every
//! `--poll-us`) probes only each engine's sequence and heartbeat words (one
//! cache line) and reads and queues just the engines that published a
//! snapshot or whose heartbeat moved nine tenths of a period (what keeps their keys
//! alive), and the new file of a restarted engine once the old file's
//! heartbeat is late; [`Relay::tick`] (every [`FULL_PASS_INTERVAL`]) reads
//! everything: it deletes the keys of engines that left, counts errors and
//! relays anything the polls missed.
//!
//! Cache digests (docs/FORMAT.md, "Cache residency"; docs/REDIS.md, "The
//! node agent"): the reads map each engine's `<dir>.cache/<id>`, and a
//! record whose snapshot names a digest version not relayed yet goes after
//! that digest's value, in the same pipeline. A digest that cannot be read
//! is that engine's error (counted, logged once), and its records are
//! relayed with `cache_blocks` and `cache_version` 0, so that no record in
//! Redis names a digest Redis does not hold.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use engine_state_reader::{
    EngineState, Freshness, ReaderOptions, Reading, ShmDir, Snapshot, Status, Writer,
};
use engine_state_redis::{
    InlineSink, RecordWriter, RedisRecord, RedisTarget, RelayWrite, SinkOp, SinkStats,
};
use engine_state_shm_format::{
    encode_digest_value, heartbeat, monotonic_ns, CacheDigest, DigestRecord,
};

use crate::config::AgentConfig;
use crate::error::Error;
use crate::telemetry;

/// How often the agent lists the directory (see [`Relay::new`]).
pub const RESCAN_INTERVAL: Duration = Duration::from_secs(1);

/// How often the agent reads every engine ([`Relay::tick`]). The polls relay
/// snapshots, heartbeats and replaced files; a full read of 1024 engines
/// every 50 ms was ~10 % of the agent's CPU (perf; about one point of a
/// core, docs/bench-history/2026-11-30-issues-2-to-11.md section 3) for what changes rarely: removals, unreadable files,
/// the gauges, /healthz. (Under 30 s whatever the period: the exporter drops
/// gauges not set for that long.)
pub const FULL_PASS_INTERVAL: Duration = Duration::from_millis(500);

/// What one full pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TickReport {
    /// Engines read from the directory.
    pub engines: usize,
    /// Records queued for Redis: what the polls had not relayed (rare).
    pub queued: usize,
    /// Engines that left the directory (their keys are deleted).
    pub removed: usize,
    /// Unreadable files, or 1 when the directory itself could not be read.
    pub read_errors: usize,
}

/// The relay's state: the directory reader, the sink and what was sent last.
#[derive(Debug)]
pub struct Relay {
    shm: ShmDir,
    reading: Reading,
    /// What the last [`Relay::poll`] found changed (kept for its allocation).
    changed: Reading,
    sender: RecordSender,
    known_errors: HashSet<String>,
    /// Engines whose cache digest error was logged (again only once it was
    /// read, or the engine left).
    cache_errors_logged: HashSet<Arc<str>>,
    /// Why the last full pass could not list the directory (None: it could).
    directory_error: Option<String>,
}

/// Turns engine states into Redis records for the sink: what was queued to
/// it last per engine, and the batch of the current pass.
#[derive(Debug)]
struct RecordSender {
    /// None in metrics-only mode (no `--redis`): nothing is queued.
    sink: Option<InlineSink>,
    last_sent: HashMap<Arc<str>, SentRecord, foldhash::fast::RandomState>,
    next_seq: u64,
    snapshot_age: metrics::Histogram,
    /// Records (and the digests they name) of the current pass, handed to
    /// the sink at once at its end.
    batch: Vec<(Arc<str>, RelayWrite)>,
    /// A heartbeat newer than the relayed record by less than this (nine
    /// tenths of a period) is not worth a write of its own (see
    /// [`RecordSender::queue`]).
    heartbeat_step_ns: u64,
    /// Engines of the current pass that were relayed before (when a tick
    /// counts all of `last_sent`, none left the directory).
    sent_before: usize,
    /// A record queued this long after the engine's previous one may find
    /// the digest key expired (records refresh it; half the key's TTL): its
    /// digest is queued again.
    digest_resend_ns: u64,
}

/// What was queued to the sink last for one engine.
#[derive(Clone, Copy, Debug, PartialEq)]
struct SentRecord {
    /// The record's `generation`: the file's [`run_of`].
    generation: u64,
    heartbeat_mono_ns: u64,
    snapshot: Snapshot,
    /// From the file's header (fixed for a file).
    writer_pid: u32,
    publish_period_us: u32,
    /// The version of the last cache digest queued for this run (0: none).
    digest_version: u64,
    /// The relay's `CLOCK_MONOTONIC` when the last record was queued.
    queued_ns: u64,
}

/// The Redis `generation` of the records relayed from a file: its header's
/// `created_unix_ns` (carried on every state read from it,
/// [`Writer::created_unix_ns`]), as a direct publisher's is its start time
/// (one rule: when the writer started, in ns since 1970).
///
/// Not the file's own generation, which is 1 for every fresh file: engines in
/// containers often have the same pid in every pod, and the key's owner is
/// (`writer_pid`, `generation`), so two hosts relaying one engine id would
/// both pass the owner check and overwrite (and delete) each other's key. A
/// new file of the same engine (a restart, a replacement) is a new run too.
fn run_of(writer: &Writer) -> u64 {
    writer.created_unix_ns
}

impl Relay {
    /// Opens the directory (creating it when missing, logged once as a warning)
    /// and starts the sink, if there is a Redis to relay to (metrics-only
    /// mode otherwise: the passes read the directory and relay nothing). A
    /// wrong Redis password is an error here; an unreachable server is not
    /// (the sink reconnects with backoff).
    ///
    /// The sink is owner-checked: an engine id another live process writes
    /// to the same Redis directly (a `Publisher` with a `redis://` URI) is
    /// not overwritten (see [`InlineSink::owner_checked`]).
    pub fn new(config: &AgentConfig) -> Result<Relay, Error> {
        if !config.shm_dir.exists() {
            std::fs::create_dir_all(&config.shm_dir).map_err(|io| Error::CreateDirectory {
                dir: config.shm_dir.clone(),
                io,
            })?;
            // A typo in --uri would otherwise relay an empty directory in
            // silence, while the engines publish elsewhere.
            tracing::warn!(
                "esagent: created the missing engine-state directory {dir}; the engines must \
                 publish into this same path (AGENTIC_ENGINE_STATE_URI=file://{dir}) and local \
                 readers (esdump, routers) read it, or nothing they do is relayed or seen",
                dir = config.shm_dir.display()
            );
        }
        let options = ReaderOptions {
            freshness: Freshness {
                stale_after: config.stale_after,
                ..Freshness::default()
            },
            // A listing costs ~2 µs per engine (and a liveness check of its
            // writer): once a second instead of the readers' 4 times, 1.3 ms
            // of CPU per second saved at 1024 engines. New engines are found
            // within a second; replaced files are reopened at once anyway.
            rescan_interval: RESCAN_INTERVAL,
            // Relayed with the records; nobody reads them in metrics-only
            // mode.
            cache_digests: config.redis.is_some(),
        };
        let shm = ShmDir::open(&config.shm_dir, options)?;
        let sink = match &config.redis {
            Some(redis) => Some(sink(redis)?),
            None => None,
        };
        Ok(Relay {
            shm,
            reading: Reading::default(),
            changed: Reading::default(),
            sender: RecordSender {
                sink,
                last_sent: HashMap::default(),
                // Strictly above anything an earlier run of the agent on this host sent.
                next_seq: monotonic_ns(),
                // Not exported in metrics-only mode.
                snapshot_age: match &config.redis {
                    Some(_) => metrics::histogram!(telemetry::SNAPSHOT_AGE),
                    None => metrics::Histogram::noop(),
                },
                batch: Vec::new(),
                // Nine tenths: an idle engine's every heartbeat (timers
                // jitter), not one between two publishes of a busy engine.
                heartbeat_step_ns: heartbeat::relay_step(config.period).as_nanos() as u64,
                sent_before: 0,
                digest_resend_ns: config
                    .redis
                    .as_ref()
                    .map_or(u64::MAX, |redis| redis.ttl().as_nanos() as u64 / 2),
            },
            known_errors: HashSet::new(),
            cache_errors_logged: HashSet::new(),
            directory_error: None,
        })
    }

    /// The fast pass: queues the engines that published a snapshot since
    /// they were last read, or whose heartbeat is nearly a period newer, at
    /// the cost of two loads from one cache line per engine when nothing
    /// changed. Returns how many records were queued.
    pub fn poll(&mut self) -> usize {
        if !self.relays() {
            return 0; // the gauges are the tick's
        }
        let now = monotonic_ns();
        let step = Some(Duration::from_nanos(self.sender.heartbeat_step_ns));
        if self
            .shm
            .read_changed_at(&mut self.changed, now, step)
            .is_err()
        {
            return 0; // the next tick reports it
        }
        let mut queued = 0;
        for engine in &self.changed.engines {
            queued += usize::from(self.sender.queue(engine, now));
        }
        self.sender.send();
        queued
    }

    /// The full pass: read every engine and queue what the polls did not,
    /// delete the keys of engines that left, count unreadable files.
    pub fn tick(&mut self) -> TickReport {
        self.tick_at(monotonic_ns())
    }

    /// [`Relay::tick`] at a given `CLOCK_MONOTONIC` time (tests pass time in).
    pub fn tick_at(&mut self, now: u64) -> TickReport {
        let mut report = TickReport::default();
        if let Err(error) = self.shm.read_at(&mut self.reading, now) {
            metrics::counter!(telemetry::READ_ERRORS).increment(1);
            report.read_errors = 1;
            let text = error.to_string();
            self.note_error(&text);
            self.directory_error = Some(text);
            return report;
        }
        if let Some(error) = self.directory_error.take() {
            tracing::info!("esagent: the directory can be listed again (was: {error})");
        }
        report.engines = self.reading.engines.len();
        report.read_errors = self.reading.errors.len();
        let new_errors = self
            .reading
            .errors
            .iter()
            .filter(|e| !self.known_errors.contains(&e.name))
            .count();
        if new_errors > 0 {
            metrics::counter!(telemetry::READ_ERRORS).increment(new_errors as u64);
        }
        self.known_errors = self.reading.errors.iter().map(|e| e.name.clone()).collect();
        self.log_cache_errors();
        self.sender.sent_before = 0;
        // Metrics-only mode: nothing to queue (and `last_sent` stays empty).
        let relayed = if self.relays() {
            &self.reading.engines[..]
        } else {
            &[]
        };
        for engine in relayed {
            report.queued += usize::from(self.sender.queue(engine, now));
        }
        if self.sender.sent_before != self.sender.last_sent.len() {
            // Not every engine relayed before is still there.
            let reading = &self.reading;
            let batch = &mut self.sender.batch;
            self.sender.last_sent.retain(|id, _| {
                let present = reading.get(id).is_some();
                if !present {
                    // The writer closed (its file is gone): so does its key
                    // (and its digest key).
                    batch.push((id.clone(), SinkOp::Delete.into()));
                    report.removed += 1;
                }
                present
            });
        }
        self.sender.send();
        report
    }

    /// Logs each engine's cache digest error once (until its digest is read
    /// again, or the engine leaves): the counter counts it, and its records
    /// are relayed without a digest meanwhile.
    fn log_cache_errors(&mut self) {
        let reading = &self.reading;
        self.cache_errors_logged
            .retain(|id| reading.get(id).is_some_and(|e| e.cache.is_none()));
        for error in &reading.errors {
            if let Some(engine_id) = error.error.cache_engine_id() {
                if !self.cache_errors_logged.contains(engine_id) {
                    tracing::warn!(
                        "esagent: {}; meanwhile its records are relayed without a digest \
                         (cache_blocks and cache_version 0)",
                        error.error
                    );
                    self.cache_errors_logged.insert(Arc::from(engine_id));
                }
            }
        }
    }

    fn note_error(&mut self, text: &str) {
        if self.known_errors.insert(text.to_owned()) {
            tracing::warn!("esagent: {text}");
        }
    }

    /// Why the last full pass could not list the directory, if it could not
    /// (removed, unreadable, out of file descriptors): `/healthz` is then
    /// unhealthy.
    pub fn directory_error(&self) -> Option<&str> {
        self.directory_error.as_deref()
    }

    /// The last reading of the directory.
    pub fn reading(&self) -> &Reading {
        &self.reading
    }

    /// The directory being relayed.
    pub fn shm_dir(&self) -> &std::path::Path {
        self.shm.dir()
    }

    /// Whether there is a Redis to relay to (false: metrics-only mode).
    pub fn relays(&self) -> bool {
        self.sender.sink.is_some()
    }

    /// The sink's counters (None: metrics-only mode).
    pub fn sink_stats(&self) -> Option<&SinkStats> {
        self.sender.sink.as_ref().map(InlineSink::stats)
    }

    /// Writes what is pending (at most `timeout`).
    pub fn shutdown(&mut self, timeout: Duration) {
        if let Some(sink) = self.sender.sink.as_mut() {
            sink.flush(timeout);
        }
    }
}

impl RecordSender {
    /// Writes the queued records as one pipeline (and collects the replies
    /// of the previous one); called every pass, with or without records.
    fn send(&mut self) {
        if let Some(sink) = self.sink.as_mut() {
            sink.submit(&mut self.batch);
        }
    }

    /// Queues `engine` (read at `now`) unless it is what was queued last;
    /// true when queued.
    ///
    /// A new generation or snapshot is always queued. A heartbeat alone is
    /// queued only when it is at least nine tenths of a period newer than
    /// the record relayed last: an idle engine's key is refreshed once a
    /// period, a stopped heartbeat lets the key expire, and a busy engine,
    /// whose publishes already carry its heartbeat (and whose heartbeat
    /// thread ticks at its own phase), costs one record a period, not two.
    fn queue(&mut self, engine: &EngineState, now: u64) -> bool {
        let last = self.last_sent.get_mut(&engine.engine_id);
        self.sent_before += usize::from(last.is_some());
        // A dead or torn engine is not refreshed: its key expires, and
        // Redis readers see it dead, as a reader of the file would.
        if matches!(engine.status, Status::Dead | Status::Torn) {
            return false;
        }
        // A stamp too far ahead of this host's clock (a forged file, a writer
        // in another time namespace) has no age: relaying it, clamped to
        // `now` below, would make the key look freshly stamped at every pass
        // and keep it alive forever. Not refreshed, the key expires, and Redis
        // readers see the engine dead (the full pass reports the file's error).
        if engine.clock_ahead {
            return false;
        }
        // The writer's own stamp, as the reader read it; one taken after
        // `now` (another CPU) counts as `now`, as its age does.
        let heartbeat_mono_ns = engine.writer.heartbeat_mono_ns.min(now);
        let run = run_of(&engine.writer);
        let current = match last {
            Some(last)
                if last.generation == run
                    && last.snapshot == engine.snapshot
                    && heartbeat_mono_ns.saturating_sub(last.heartbeat_mono_ns)
                        < self.heartbeat_step_ns =>
            {
                return false
            }
            Some(last) if last.generation == run => {
                last.heartbeat_mono_ns = heartbeat_mono_ns;
                last.snapshot = engine.snapshot;
                *last
            }
            last => {
                if last.is_some() {
                    // A new run of an engine this relay relayed: the key
                    // holds our own record of its previous file (replaced
                    // after a truncation, or an engine restart), which the
                    // owner check would take for another live writer's.
                    // Deleted first (owner-checked, as a clean close: only
                    // our record), so the new run takes the key over
                    // quietly.
                    self.batch
                        .push((engine.engine_id.clone(), SinkOp::Delete.into()));
                }
                // A new engine or a new run of it (a new file): its
                // header, once.
                let current = SentRecord {
                    generation: run,
                    heartbeat_mono_ns,
                    snapshot: engine.snapshot,
                    writer_pid: engine.writer.pid,
                    publish_period_us: engine.writer.publish_period_us,
                    digest_version: 0,
                    queued_ns: now,
                };
                match last {
                    Some(last) => *last = current,
                    None => {
                        self.last_sent.insert(engine.engine_id.clone(), current);
                    }
                }
                current
            }
        };
        let snapshot = self.with_digest(engine, &current, now);
        self.next_seq += 1;
        let writer = RecordWriter {
            pid: current.writer_pid,
            publish_period_us: current.publish_period_us,
            generation: current.generation,
        };
        let record = RedisRecord::active(writer, self.next_seq, heartbeat_mono_ns, snapshot);
        self.batch
            .push((engine.engine_id.clone(), SinkOp::Set(record).into()));
        self.snapshot_age.record(engine.capture_age.as_secs_f64());
        true
    }
}

impl RecordSender {
    /// The snapshot to relay for `engine` (queued at `now`, `sent` being
    /// what was queued for it before): the one read, after queueing the
    /// digest it names when this run's digest of that version was not
    /// queued yet (or may have expired since the previous record), so that
    /// the digest precedes the record in the pipeline. When that digest
    /// cannot be had (unreadable, torn, damaged: the full pass reports it),
    /// with `cache_blocks` and `cache_version` 0: no digest, rather than a
    /// version Redis does not hold (or an older one, which the engine no
    /// longer vouches for).
    fn with_digest(&mut self, engine: &EngineState, sent: &SentRecord, now: u64) -> Snapshot {
        let mut snapshot = engine.snapshot;
        let version = snapshot.cache_version;
        let last = self
            .last_sent
            .get_mut(&engine.engine_id)
            .expect("queued above");
        let gap = now.saturating_sub(last.queued_ns);
        last.queued_ns = now;
        if gap >= self.digest_resend_ns {
            last.digest_version = 0;
        }
        if version == 0 || last.digest_version >= version {
            return snapshot;
        }
        // The reader hands out a digest of the file's generation, at least
        // the version the snapshot names (a writer writes it first).
        let value = engine
            .cache
            .as_deref()
            .filter(|digest| digest.version() >= version)
            .and_then(|digest| digest_value(engine, digest, sent).map(|v| (digest.version(), v)));
        match value {
            Some((digest_version, value)) => {
                last.digest_version = digest_version;
                self.batch
                    .push((engine.engine_id.clone(), RelayWrite::Digest(value)));
            }
            None => {
                snapshot.cache_blocks = 0;
                snapshot.cache_version = 0;
            }
        }
        snapshot
    }
}

/// The Redis value of `digest`, read from `engine`'s digest file, for the
/// records of `sent` (their `writer_pid` and `generation`, as docs/FORMAT.md,
/// "On Redis" says), with the file's `held` and `kv_block_size` as the
/// reader hands them on ([`CacheDigest::held`]); `captured_unix_ns` is the snapshot's
/// `captured_unix_ns` moved back by the monotonic time between the two
/// captures (display). None only for a digest beyond `MAX_DIGEST_ENTRIES`,
/// which the reader refuses anyway.
fn digest_value(
    engine: &EngineState,
    digest: &CacheDigest,
    sent: &SentRecord,
) -> Option<Arc<[u8]>> {
    let snapshot = &engine.snapshot;
    let since_digest = snapshot
        .captured_mono_ns
        .saturating_sub(digest.captured_mono_ns());
    let record = DigestRecord {
        writer_pid: sent.writer_pid,
        generation: sent.generation,
        created_unix_ns: engine.writer.created_unix_ns,
        kv_block_size: digest.kv_block_size(),
        captured_unix_ns: snapshot.captured_unix_ns.saturating_sub(since_digest),
        held: digest.held(),
        digest: digest.clone(),
    };
    encode_digest_value(&record).ok().map(Arc::from)
}

/// The owner-checked sink to `redis`: an engine id another live process
/// writes to the same Redis directly (a `Publisher` with a `redis://` URI)
/// is not overwritten (see [`InlineSink::owner_checked`]).
fn sink(redis: &RedisTarget) -> Result<InlineSink, Error> {
    let connection = match redis.connect() {
        Ok(con) => Some(con),
        Err(e) if e.is_auth_error() => return Err(engine_state_reader::Error::from(e).into()),
        Err(_) => None,
    };
    let lag = metrics::histogram!(telemetry::RELAY_LAG);
    // Written from the relay thread itself: one wake-up per poll, not
    // three (see `InlineSink`).
    Ok(InlineSink::new(
        redis.clone(),
        connection,
        Some(Box::new(move |d: Duration| lag.record(d.as_secs_f64()))),
    )
    .owner_checked())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use engine_state_shm_format::{EngineId, ShmWriter, WriterOptions};

    /// A relay of `dir` whose Redis is unreachable (records are kept, not
    /// written: what is queued is what the relay decided to send).
    fn relay(dir: &std::path::Path) -> Relay {
        try_relay(dir).unwrap()
    }

    fn try_relay(dir: &std::path::Path) -> Result<Relay, Error> {
        // A port that was free a moment ago: nobody answers on it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let unreachable = format!("redis://127.0.0.1:{port}/0");
        let args = crate::Args::parse_from([
            "esagent",
            "--uri",
            &format!("file://{}", dir.display()),
            "--redis",
            &unreachable,
            "--period-ms",
            "50",
        ]);
        Relay::new(&args.into_config().unwrap())
    }

    #[test]
    fn uncreatable_directory_is_an_io_error_not_a_bad_setting() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("file"), b"").unwrap();
        let below_a_file = dir.path().join("file/sub");
        let err = try_relay(&below_a_file).unwrap_err();
        assert!(
            matches!(&err, Error::CreateDirectory { dir, .. } if *dir == below_a_file),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .contains("cannot create the engine-state directory"),
            "{err}"
        );
    }

    #[test]
    fn a_stamp_ahead_of_the_clock_is_never_relayed() {
        let dir = tempfile::tempdir().unwrap();
        let hour = 3_600_000_000_000;
        let now = monotonic_ns();
        let writer = |id: &str, heartbeat: u64, captured: u64| {
            let snap = Snapshot {
                captured_mono_ns: captured,
                num_running: 3,
                ..Snapshot::default()
            };
            let id = EngineId::new(id).unwrap();
            let w = ShmWriter::create(dir.path(), &id, &WriterOptions::default(), &snap).unwrap();
            w.stamp_heartbeat(heartbeat);
            w
        };
        let _hour_ahead = writer("hour-ahead", now + hour, now + hour);
        let _at_max = writer("at-max", u64::MAX, u64::MAX);
        let _capture_ahead = writer("capture-ahead", now, now + hour);
        let mut relay = relay(dir.path());
        // Without the check, each of these was relayed with its stamp
        // clamped to `now`, and again at every pass as `now` advanced.
        assert_eq!(relay.poll(), 0, "a poll relays none of them");
        for pass in 0..3u64 {
            // Each pass a relay step (50 ms) later than the one before.
            let report = relay.tick_at(now + pass * 60_000_000);
            assert_eq!(report.engines, 3);
            assert_eq!(report.queued, 0, "pass {pass}: {report:?}");
            assert_eq!(report.read_errors, 3, "each is reported: {report:?}");
            for e in &relay.reading().engines {
                assert_eq!(e.status, Status::Stale, "{e:?}");
            }
        }
        assert!(relay.sender.last_sent.is_empty(), "no key was ever written");
        assert!(relay.sender.batch.is_empty());
    }

    #[test]
    fn heartbeats_are_relayed_once_a_period_not_between_publishes() {
        let dir = tempfile::tempdir().unwrap();
        let id = EngineId::new("busy").unwrap();
        let ms = 1_000_000;
        // All stamps in the past, so that ages are exact.
        let t0 = monotonic_ns() - 1_000 * ms;
        let snap = |step| Snapshot {
            captured_mono_ns: t0,
            step,
            ..Snapshot::default()
        };
        let mut w =
            ShmWriter::create(dir.path(), &id, &WriterOptions::default(), &snap(1)).unwrap();
        w.stamp_heartbeat(t0);
        let mut relay = relay(dir.path());
        assert_eq!(relay.poll(), 1, "a new engine");
        assert_eq!(relay.poll(), 0, "nothing new");

        // The heartbeat thread ticks between two publishes: not worth a record.
        w.stamp_heartbeat(t0 + 30 * ms);
        assert_eq!(relay.poll(), 0);
        // A publish (its heartbeat stamped with it) is always relayed.
        w.publish(&snap(2)).unwrap();
        w.stamp_heartbeat(t0 + 50 * ms);
        assert_eq!(relay.poll(), 1);
        // An idle engine: each heartbeat a period later is relayed (with
        // some timer jitter), which keeps its key alive.
        w.stamp_heartbeat(t0 + 98 * ms);
        assert_eq!(relay.poll(), 1);
        w.stamp_heartbeat(t0 + 110 * ms);
        assert_eq!(relay.poll(), 0);
        w.stamp_heartbeat(t0 + 150 * ms);
        assert_eq!(relay.poll(), 1);
    }
}
