//! Publishing to Redis: the first, owner-checked write
//! (`engine_state_redis::claim`), a sink thread that writes the latest
//! record, and the heartbeat that re-sends it (docs/REDIS.md); the cache
//! digest goes through the same sink to `<prefix>cache:<id>`, written on
//! change, its expiry refreshed with every record (docs/REDIS.md, "Key
//! schema").

use std::sync::{Arc, Mutex};
use std::time::Duration;

use engine_state_redis::{
    Claim, RecordWriter, RedisRecord, RedisSink, RedisTarget, SinkHandle, SinkOp, SinkStats,
};
use engine_state_shm_format::{
    encode_digest_value, heartbeat, unix_ns, CacheDigest, Clock, DigestRecord, Snapshot,
};

use crate::cache::NextDigest;
use crate::config::PublisherConfig;
use crate::error::Error;
use crate::heartbeat::{HeartbeatThread, Ticks};
use crate::stamp::{stamp, CacheWords};

/// How long `close()` waits for the Redis sink to delete the engine's key.
const CLOSE_FLUSH_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(crate) struct RedisBackend {
    sink: RedisSink,
    engine_id: Arc<str>,
    /// The latest record; the heartbeat thread re-sends it with a new heartbeat.
    record: Arc<Mutex<RedisRecord>>,
    /// Who writes (the owner check of the record and of the digest).
    writer: RecordWriter,
    /// When this writer started (its digest values' `created_unix_ns`).
    created_unix_ns: u64,
}

impl RedisBackend {
    /// Connects, claims the engine's key, starts the sink thread and the
    /// heartbeat thread. A wrong password or missing permission is an
    /// error; an unreachable server is not (the sink keeps reconnecting, and
    /// its writes claim the key the same way).
    pub(crate) fn start(
        target: &RedisTarget,
        config: &PublisherConfig,
        clock: &Clock,
        ticks: Ticks,
    ) -> Result<(RedisBackend, HeartbeatThread), Error> {
        let target = target.clone();
        let mut connection = match target.connect() {
            Ok(con) => Some(con),
            Err(e) if e.is_auth_error() => return Err(Error::Redis(e)),
            Err(_) => None,
        };
        let engine_id: Arc<str> = Arc::from(config.engine_id.as_str());
        let first = stamp(Snapshot::default(), clock, CacheWords::default());
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
        let (handle, beat_record, beat_id) = (sink.handle(), record.clone(), engine_id.clone());
        let (period, beat_clock) = (config.period, clock.clone());
        let heartbeat = HeartbeatThread::spawn(
            move || {
                beat(&handle, &beat_id, &beat_record, period, &beat_clock);
                true
            },
            ticks,
            &config.engine_id,
        )?;
        Ok((
            RedisBackend {
                sink,
                engine_id,
                record,
                writer,
                created_unix_ns: writer.generation,
            },
            heartbeat,
        ))
    }

    /// Hands `snapshot` (stamped here, with the next heartbeat) to the sink.
    #[inline]
    pub(crate) fn publish(&mut self, snapshot: Snapshot, clock: &Clock, cache: CacheWords) {
        let snapshot = stamp(snapshot, clock, cache);
        let record = {
            let mut record = lock(&self.record);
            record.snapshot = snapshot;
            record.heartbeat_seq += 1;
            record.heartbeat_mono_ns = snapshot.captured_mono_ns;
            *record
        };
        self.sink.send(&self.engine_id, SinkOp::Set(record));
    }

    /// Hands the digest `next` to the sink, which writes it (owner-checked)
    /// before any later record, so no record names a version the key does
    /// not hold yet (docs/REDIS.md, "Key schema").
    pub(crate) fn publish_cache(&mut self, next: &NextDigest<'_>, clock: &Clock) {
        let record = DigestRecord {
            writer_pid: self.writer.pid,
            generation: self.writer.generation,
            created_unix_ns: self.created_unix_ns,
            kv_block_size: next.kv_block_size,
            captured_unix_ns: clock.unix_ns().unwrap_or_else(unix_ns),
            held: next.held,
            digest: CacheDigest::new(next.version, clock.now_ns(), next.blocks.to_vec()),
        };
        // Cannot fail: `publish_cache` refused more than MAX_DIGEST_ENTRIES.
        let value = encode_digest_value(&record).expect("a digest within the entry bound");
        self.sink.send_cache(&self.engine_id, Arc::from(value));
    }

    /// Deletes the engine's key (like removing the file: the engine leaves
    /// the registry at once) and stops the sink.
    pub(crate) fn close(mut self) {
        self.sink.send(&self.engine_id, SinkOp::Delete);
        self.sink.flush(CLOSE_FLUSH_TIMEOUT);
        self.sink.stop();
    }

    /// In a forked child: forgets the parent's sink thread.
    pub(crate) fn forget(self) {
        self.sink.forget();
    }

    /// The sink's counters.
    pub(crate) fn stats(&self) -> &SinkStats {
        self.sink.stats()
    }
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
fn beat(
    sink: &SinkHandle,
    engine_id: &Arc<str>,
    record: &Mutex<RedisRecord>,
    period: Duration,
    clock: &Clock,
) {
    let record = {
        let mut record = lock(record);
        let now = clock.now_ns();
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
