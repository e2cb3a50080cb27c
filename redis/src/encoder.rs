//! The commands both Redis sinks send: [`SinkOp`]s encoded as one RESP
//! pipeline, and the rule for whose records a sink may overwrite.
//!
//! Who may write an engine's key is decided by one Lua script,
//! [`SET_IF_OWNER_SCRIPT`] (and [`DELETE_IF_OWNER_SCRIPT`] for a clean
//! close), in `schema.rs`. This module decides when a sink
//! runs it ([`Ownership`]):
//!
//! - a publisher's [`crate::RedisSink`] runs it for every write
//!   ([`Ownership::EveryWrite`]);
//! - the node agent's relay ([`crate::InlineSink::owner_checked`]) runs it to
//!   claim a key, then writes plain `SET`s while it knows it holds the key
//!   ([`Ownership::Claimed`]): a script costs Redis ~10× a `SET`, and the
//!   relay writes every engine of a host.
//!
//! Why a held key needs no script: the script refuses every other writer
//! while the key holds an unexpired ACTIVE record of ours, so from an
//! acknowledged write of ours, sent at `t`, until `t + ttl_ms` the key can
//! only hold our records (we are the only ones who delete them). A plain
//! `SET` is safe if it runs on the server before then; it is sent only
//! within [`hold_for`] of `t`: half of what is left of `ttl_ms` after the
//! target's network timeout (`timeout_ms`), so that one sent at the end of
//! the hold and run as late as the timeout still leaves the other half as
//! margin (for the server's clock, which measures the expiry). The script
//! runs again after a longer gap (a stale engine, a stopped process), after
//! any refusal and on every new connection. With `timeout_ms` ≥ `ttl_ms`
//! there is no hold: every write runs the script (said once on stderr).
//!
//! Residual risk: nothing makes the server run a command within the
//! timeout. A server that stalls longer (a fork, a slow script, a paused
//! VM) still holds the pipeline in its socket buffer after the sink gave
//! up on the connection, and may run a plain `SET` after our key expired
//! and another writer claimed it: the key changes hands back to us (that
//! writer's next script is refused, as if we had claimed the key first).
//! Keep `timeout_ms` well below `ttl_ms` for a wide margin.
//! This holds against writers that follow the protocol (every sink here);
//! a plain `SET` by someone else (`redis-cli`, an older version) can be
//! overwritten by a held key's next write, where [`Ownership::EveryWrite`]
//! would leave it alone.
//!
//! An engine's cache digest key follows its record's owner: every record
//! refreshes the digest's expiry, through the record's own script when the
//! record is owner-checked ([`SET_IF_OWNER_SCRIPT`] with the digest key as
//! its second key: a refused record refreshes nothing), with a plain
//! `PEXPIRE` after a plain `SET` of a held key (ours, by the argument
//! above). A writer that lost the id, or whose digest write was refused,
//! writes its digest again once the id is its own (the key may hold the
//! other writer's digest, or nothing), not before: while refused, a digest
//! write would be refused too.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine_state_shm_format::monotonic_ns;
use redis::Value;

use crate::ops::SinkOp;
use crate::replies::holder_pid;
use crate::schema::{
    cache_key, engine_key, registry_key, RecordHeader, RedisRecord, DELETE_CACHE_IF_OWNER_SCRIPT,
    DELETE_IF_OWNER_SCRIPT, RECORD_SIZE, SET_CACHE_IF_OWNER_SCRIPT, SET_IF_OWNER_SCRIPT,
};
use crate::stats::SinkStats;
use crate::target::RedisTarget;

/// How often an engine's id is re-added to the registry while it is written
/// (heals a registry entry a reader pruned during a long outage).
const REREGISTER_EVERY: Duration = Duration::from_secs(1);

/// [`Ownership::Claimed`]: how long after the sending of a write of ours
/// that Redis acknowledged its key is held (plain `SET`s): half of what
/// `ttl` leaves after `timeout` (see the module docs); zero (no hold: every
/// write is owner-checked) when `timeout` ≥ `ttl`.
pub(crate) fn hold_for(ttl: Duration, timeout: Duration) -> Duration {
    ttl.saturating_sub(timeout) / 2
}

/// When a sink runs the owner check (see the module docs).
#[derive(Debug)]
pub(crate) enum Ownership {
    /// Plain `SET` and `DEL`: whatever the key holds is replaced.
    Unchecked,
    /// Every `SET` through [`SET_IF_OWNER_SCRIPT`]; a delete through
    /// [`DELETE_IF_OWNER_SCRIPT`] as this record (the publisher's identity).
    EveryWrite([u8; RECORD_SIZE]),
    /// The script to claim a key, plain `SET`s while it is held; a delete
    /// through [`DELETE_IF_OWNER_SCRIPT`] as the engine's last record.
    Claimed,
}

/// Encodes [`SinkOp`]s as one RESP pipeline, keeping per engine what makes
/// the next `SET` cheap (its encoded key), when its id was last added to
/// the registry and whether its key is held. Used by the sink thread and by
/// [`crate::InlineSink`].
#[derive(Debug)]
pub(crate) struct PipelineEncoder {
    prefix: String,
    registry: String,
    ttl_ms: u32,
    /// `PX <ttl>` of every `SET`, encoded once.
    set_tail: Vec<u8>,
    /// Per engine written: its encoded command prefix and registration time.
    engines: HashMap<Arc<str>, EngineKeyState, foldhash::fast::RandomState>,
    /// The pipeline being built (kept for its allocation).
    pub(crate) request: Vec<u8>,
    /// Commands in `request`.
    pub(crate) commands: usize,
    /// Heartbeat stamps of the records in `request` (once its replies are
    /// settled: of the records written).
    pub(crate) sent: Vec<u64>,
    ownership: Ownership,
    /// [`Ownership::Claimed`]: per engine, the identity of our last record
    /// acknowledged as written. A delete claims it as well as the last one
    /// queued: a pipeline whose replies were lost may not have written its
    /// records, and its retry must still delete the record in the key (the
    /// relay deletes its own record of an engine's previous run before the
    /// new run's, which the owner check would otherwise refuse).
    written: HashMap<Arc<str>, (u32, u64), foldhash::fast::RandomState>,
    /// The engines deleted in the pipeline being built.
    deleted: Vec<Arc<str>>,
    /// [`Ownership::Claimed`]: how long a key stays held.
    hold_for: Duration,
    /// Per owner-checked `SET` in `request`, what [`Self::settle_claims`]
    /// needs.
    claims: Vec<Claim>,
    /// Per owner-checked cache digest write in `request`: its command's
    /// index and engine.
    cache_claims: Vec<(usize, Arc<str>)>,
    /// Per plain digest `PEXPIRE` in `request` (after a plain `SET`): its
    /// command's index and engine (a reply of 0 says the digest key is
    /// gone: written again with the engine's next record).
    pexpires: Vec<(usize, Arc<str>)>,
    /// When the pipeline was begun (both clocks).
    began: Instant,
    began_mono_ns: u64,
}

/// One owner-checked `SET` of a pipeline.
#[derive(Debug)]
struct Claim {
    /// Its index among the pipeline's commands (and replies).
    command: usize,
    /// Its record's index in `sent`.
    sent: usize,
    engine: Arc<str>,
    /// Its record's (`writer_pid`, `generation`).
    identity: (u32, u64),
    /// Through [`SET_IF_OWNER_SCRIPT`] (else a plain `SET` of a held key).
    scripted: bool,
    /// Through the script with the engine's digest key, whose expiry it
    /// refreshes when the record is written (a reply of 0: the digest key
    /// is gone).
    refreshes_cache: bool,
}

/// The encoder's state of one engine's key: its encoded `SET` head (so a
/// `SET` costs no formatting), registration, and whether the key is held.
#[derive(Debug)]
struct EngineKeyState {
    /// `*5 $3 SET $n <key> $<RECORD_SIZE>` in RESP, up to the record's bytes.
    set_head: Vec<u8>,
    /// When the id was last added to the registry (None: not since connecting).
    registered: Option<Instant>,
    /// Another writer held the key at the last owner-checked write (logged
    /// once per change).
    refused: bool,
    /// [`Ownership::Claimed`]: when the last pipeline with an acknowledged
    /// write of ours to the key was begun (None: not held).
    held_since: Option<Instant>,
    /// The identity (`writer_pid`, `generation`) of the last record queued,
    /// which a delete claims.
    identity: (u32, u64),
    /// The engine's cache digest key, once a digest of it was queued: its
    /// expiry is refreshed with every record, and a delete deletes it.
    cache: Option<CacheKey>,
}

/// An engine's cache digest key, the plain `PEXPIRE` that every plain
/// record of the engine carries (encoded once), and the last digest value
/// queued: a key that Redis lost (expired while the writer was cut off, a
/// restart without persistence, `FLUSHALL`), or that may hold another
/// writer's digest (ours was refused, or the id was another's for a
/// while), is written again from it, since the writer sends a digest only
/// when it changes.
#[derive(Debug)]
struct CacheKey {
    key: String,
    pexpire: Vec<u8>,
    value: Vec<u8>,
    /// The key may not hold `value`: write it before the next record that
    /// is not refused.
    lost: bool,
}

impl EngineKeyState {
    fn new(prefix: &str, id: &str, identity: (u32, u64)) -> EngineKeyState {
        EngineKeyState {
            set_head: set_head(&engine_key(prefix, id)),
            registered: None,
            refused: false,
            held_since: None,
            identity,
            cache: None,
        }
    }
}

/// The (`writer_pid`, `generation`) of a record's or digest value's bytes
/// (the same offsets in both; zeros when too short).
fn identity_of(value: &[u8]) -> (u32, u64) {
    let (pid_at, generation_at) = (
        core::mem::offset_of!(RecordHeader, writer_pid),
        core::mem::offset_of!(RecordHeader, generation),
    );
    let pid = value
        .get(pid_at..pid_at + 4)
        .map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
    let generation = value
        .get(generation_at..generation_at + 8)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    (pid, generation)
}

/// `id`'s digest key may not hold its last queued digest: written again
/// before its next record that is not refused.
fn cache_lost(
    engines: &mut HashMap<Arc<str>, EngineKeyState, foldhash::fast::RandomState>,
    id: &str,
) {
    if let Some(cache) = engines.get_mut(id).and_then(|key| key.cache.as_mut()) {
        cache.lost = true;
    }
}

/// The RESP bytes of a `SET` after the value: `PX <ttl_ms>`.
fn set_tail(ttl_ms: u32) -> Vec<u8> {
    let ttl = ttl_ms.to_string();
    format!("\r\n$2\r\nPX\r\n${}\r\n{ttl}\r\n", ttl.len()).into_bytes()
}

/// The RESP bytes of `SET <key> ` up to the value's bytes.
fn set_head(key: &str) -> Vec<u8> {
    format!(
        "*5\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${RECORD_SIZE}\r\n",
        key.len()
    )
    .into_bytes()
}

impl PipelineEncoder {
    pub(crate) fn new(target: &RedisTarget, ownership: Ownership) -> PipelineEncoder {
        let ttl_ms = target.ttl().as_millis() as u32;
        PipelineEncoder {
            prefix: target.prefix().to_owned(),
            registry: registry_key(target.prefix()),
            ttl_ms,
            set_tail: set_tail(ttl_ms),
            engines: HashMap::default(),
            request: Vec::new(),
            commands: 0,
            sent: Vec::new(),
            ownership,
            hold_for: hold_for(target.ttl(), target.timeout()),
            claims: Vec::new(),
            cache_claims: Vec::new(),
            pexpires: Vec::new(),
            written: HashMap::default(),
            deleted: Vec::new(),
            began: Instant::now(),
            began_mono_ns: 0,
        }
    }

    /// Checks every write as `owner` (None: plain writes); see
    /// [`Ownership::EveryWrite`].
    pub(crate) fn for_owner(target: &RedisTarget, owner: Option<RedisRecord>) -> PipelineEncoder {
        let ownership = match owner {
            Some(record) => Ownership::EveryWrite(record.encode()),
            None => Ownership::Unchecked,
        };
        PipelineEncoder::new(target, ownership)
    }

    /// After the replies of the pipeline last begun (and found free of
    /// errors by [`crate::replies::check_replies`]): counts (and logs, once per change) the
    /// records refused because another writer holds their key, leaves only
    /// the written ones in `sent`, and notes which keys are held.
    pub(crate) fn settle_claims(
        &mut self,
        replies: &[Value],
        target: &RedisTarget,
        stats: &SinkStats,
    ) {
        // Acknowledged: the records of these are gone (or another writer's).
        for id in self.deleted.drain(..) {
            self.written.remove(&id);
        }
        for (command, id) in self.cache_claims.drain(..) {
            // The script's refusal: another writer holds the engine id (its
            // records are refused too, and that is logged with them). Ours
            // is written again once the id is ours.
            if matches!(replies.get(command), Some(Value::BulkString(_))) {
                stats.refused.fetch_add(1, Ordering::Relaxed);
                cache_lost(&mut self.engines, &id);
            }
        }
        for (command, id) in self.pexpires.drain(..) {
            // 0: no such key.
            if matches!(replies.get(command), Some(Value::Int(0))) {
                cache_lost(&mut self.engines, &id);
            }
        }
        if self.claims.is_empty() {
            return;
        }
        let mut refused_sent = Vec::new();
        for claim in self.claims.drain(..) {
            let reply = replies.get(claim.command);
            let holder = match reply {
                // The script's refusal: the holder's header.
                Some(Value::BulkString(header)) if claim.scripted => Some(holder_pid(header)),
                _ => None,
            };
            let Some(key) = self.engines.get_mut(&claim.engine) else {
                continue; // deleted later in the same pipeline
            };
            let id = &claim.engine;
            // Refused: the holder may write its digest at the key. Written
            // with a refresh that found no digest key: it is gone.
            let write_again =
                holder.is_some() || (claim.refreshes_cache && matches!(reply, Some(Value::Int(0))));
            if let Some(cache) = key.cache.as_mut().filter(|_| write_again) {
                cache.lost = true;
            }
            match holder {
                Some(pid) => {
                    stats.refused.fetch_add(1, Ordering::Relaxed);
                    refused_sent.push(claim.sent);
                    key.held_since = None;
                    if !key.refused {
                        // Through `crate::log`; the target prints without
                        // its password.
                        crate::log::warn(format_args!(
                            "engine-state: engine id {id:?} is written by another live process \
                             (pid {pid} on its host) at Redis key {:?} ({target}); this \
                             process's records of it are not written until that key expires \
                             (ttl_ms after the other writer's last write). Give each engine \
                             its own id (AGENTIC_WORKER_ID), or stop the other writer",
                            engine_key(&self.prefix, id)
                        ));
                    }
                    key.refused = true;
                }
                None => {
                    key.held_since = Some(self.began);
                    self.written.insert(claim.engine.clone(), claim.identity);
                    if key.refused {
                        crate::log::warn(format_args!(
                            "engine-state: engine id {id:?}: the other writer's key is gone \
                             (it closed, or its key expired); this process writes it again \
                             ({target})"
                        ));
                        key.refused = false;
                    }
                }
            }
        }
        for sent in refused_sent.into_iter().rev() {
            self.sent.remove(sent);
        }
    }

    /// Starts a new pipeline.
    pub(crate) fn begin(&mut self) {
        self.request.clear();
        self.commands = 0;
        self.sent.clear();
        self.claims.clear();
        self.cache_claims.clear();
        self.pexpires.clear();
        self.deleted.clear();
        self.began = Instant::now();
        self.began_mono_ns = monotonic_ns();
    }

    /// A new connection may reach a server that lost the registry (register
    /// every engine again with its next write) or that failed over (claim
    /// every key again).
    pub(crate) fn connection_lost(&mut self) {
        for key in self.engines.values_mut() {
            key.registered = None;
            key.held_since = None;
        }
    }

    /// Appends `op` for `id` to the pipeline.
    pub(crate) fn push(&mut self, id: &Arc<str>, op: &SinkOp) {
        match op {
            SinkOp::Set(record) => self.push_set(id, record),
            SinkOp::Delete => self.push_delete(id),
        }
    }

    /// Appends the write of `id`'s cache digest `value` (a digest value,
    /// docs/FORMAT.md, "Cache residency"): owner-checked against the
    /// engine's record ([`SET_CACHE_IF_OWNER_SCRIPT`]) unless this sink
    /// writes unchecked. From now on every record of `id` refreshes the
    /// digest key's expiry.
    pub(crate) fn push_cache(&mut self, id: &Arc<str>, value: &[u8]) {
        let (prefix, ttl_ms) = (&self.prefix, self.ttl_ms);
        let identity = identity_of(value);
        let key = self
            .engines
            .entry(id.clone())
            .or_insert_with(|| EngineKeyState::new(prefix, id, identity));
        let cache = key.cache.get_or_insert_with(|| {
            let key = cache_key(prefix, id);
            let pexpire = redis::cmd("PEXPIRE")
                .arg(&key)
                .arg(ttl_ms)
                .get_packed_command();
            CacheKey {
                key,
                pexpire,
                value: Vec::new(),
                lost: false,
            }
        });
        cache.value.clear();
        cache.value.extend_from_slice(value);
        cache.lost = false;
        self.write_cache(id);
    }

    /// Appends the write of `id`'s digest key from its last queued value.
    fn write_cache(&mut self, id: &Arc<str>) {
        let Some(cache) = self.engines.get(id).and_then(|key| key.cache.as_ref()) else {
            return;
        };
        if matches!(self.ownership, Ownership::Unchecked) {
            redis::cmd("SET")
                .arg(&cache.key)
                .arg(&cache.value[..])
                .arg("PX")
                .arg(self.ttl_ms)
                .write_packed_command(&mut self.request);
        } else {
            redis::cmd("EVAL")
                .arg(SET_CACHE_IF_OWNER_SCRIPT)
                .arg(2)
                .arg(engine_key(&self.prefix, id))
                .arg(&cache.key)
                .arg(&cache.value[..])
                .arg(self.ttl_ms)
                .write_packed_command(&mut self.request);
            self.cache_claims.push((self.commands, id.clone()));
        }
        self.commands += 1;
    }

    fn push_set(&mut self, id: &Arc<str>, record: &RedisRecord) {
        // Not while another writer holds the id (the write would be
        // refused; it is written once a record of ours is).
        let lost = self
            .engines
            .get_mut(id)
            .filter(|key| !key.refused)
            .and_then(|key| key.cache.as_mut())
            .is_some_and(|cache| std::mem::take(&mut cache.lost));
        if lost {
            // Before the record that names it.
            self.write_cache(id);
        }
        let now = self.began;
        let prefix = &self.prefix;
        let key = self.engines.entry(id.clone()).or_insert_with(|| {
            EngineKeyState::new(prefix, id, (record.writer_pid, record.generation))
        });
        key.identity = (record.writer_pid, record.generation);
        let mut record = *record;
        record.ttl_ms = self.ttl_ms;
        record.write_delay_us = (self.began_mono_ns.saturating_sub(record.heartbeat_mono_ns) / 1000)
            .min(u64::from(u32::MAX)) as u32;
        let scripted = match self.ownership {
            Ownership::Unchecked => None,
            Ownership::EveryWrite(_) => Some(true),
            // Not held (never, or too long ago): claim it.
            Ownership::Claimed => Some(
                key.held_since
                    .is_none_or(|t| now.saturating_duration_since(t) >= self.hold_for),
            ),
        };
        if let Some(scripted) = scripted {
            self.claims.push(Claim {
                command: self.commands,
                sent: self.sent.len(),
                engine: id.clone(),
                identity: key.identity,
                scripted,
                refreshes_cache: scripted && key.cache.is_some(),
            });
        }
        if scripted == Some(true) {
            // Written only while no other live writer holds the key; so is
            // the digest's expiry refreshed (it lives as long as the
            // records that name it).
            let mut eval = redis::cmd("EVAL");
            eval.arg(SET_IF_OWNER_SCRIPT);
            match &key.cache {
                Some(cache) => eval.arg(2).arg(engine_key(prefix, id)).arg(&cache.key),
                None => eval.arg(1).arg(engine_key(prefix, id)),
            };
            eval.arg(&record.encode()[..])
                .arg(self.ttl_ms)
                .write_packed_command(&mut self.request);
            self.commands += 1;
        } else {
            // SET <key> <record> PX <ttl>, from the cached prefix.
            self.request.extend_from_slice(&key.set_head);
            self.request.extend_from_slice(&record.encode());
            self.request.extend_from_slice(&self.set_tail);
            self.commands += 1;
            if let Some(cache) = &key.cache {
                // Unchecked, or a held key: the digest is ours to refresh.
                self.request.extend_from_slice(&cache.pexpire);
                self.pexpires.push((self.commands, id.clone()));
                self.commands += 1;
            }
        }
        let due = key
            .registered
            .is_none_or(|t| now.duration_since(t) >= REREGISTER_EVERY);
        if due {
            redis::cmd("SADD")
                .arg(&self.registry)
                .arg(&**id)
                .write_packed_command(&mut self.request);
            self.commands += 1;
            key.registered = Some(now);
        }
        self.sent.push(record.heartbeat_mono_ns);
    }

    fn push_delete(&mut self, id: &Arc<str>) {
        let key = engine_key(&self.prefix, id);
        let mut state = self.engines.remove(id);
        let cache = state
            .as_mut()
            .and_then(|state| state.cache.take())
            .map(|cache| cache.key);
        self.deleted.push(id.clone());
        let as_record = |(writer_pid, generation): (u32, u64)| {
            RedisRecord {
                writer_pid,
                generation,
                ..RedisRecord::default()
            }
            .encode()
        };
        // Whose record may be deleted: ours only (another writer's stays).
        let mut mine = [None, None];
        match &self.ownership {
            Ownership::Unchecked => {}
            Ownership::EveryWrite(owner) => mine[0] = Some(*owner),
            Ownership::Claimed => {
                // The last record queued, and the last one acknowledged
                // (see `written`) when it is another. Neither: nothing of
                // this engine went through this encoder (its records were
                // replaced by the delete before a connection was up): there
                // is no key of ours to delete, and another writer's must
                // stay. A key of an earlier run expires.
                let queued = state.map(|state| state.identity);
                let written = self.written.get(id).copied().filter(|w| Some(*w) != queued);
                if queued.is_none() && written.is_none() {
                    return;
                }
                mine = [queued.map(as_record), written.map(as_record)];
            }
        }
        if mine == [None, None] {
            if let Some(cache) = &cache {
                redis::cmd("DEL")
                    .arg(cache)
                    .write_packed_command(&mut self.request);
                self.commands += 1;
            }
            redis::cmd("DEL")
                .arg(&key)
                .write_packed_command(&mut self.request);
            redis::cmd("SREM")
                .arg(&self.registry)
                .arg(&**id)
                .write_packed_command(&mut self.request);
            self.commands += 2;
            return;
        }
        for mine in mine.iter().flatten() {
            // Only our digest: another writer's stays. Before the record,
            // which is what names it.
            if let Some(cache) = &cache {
                redis::cmd("EVAL")
                    .arg(DELETE_CACHE_IF_OWNER_SCRIPT)
                    .arg(1)
                    .arg(cache)
                    .arg(&mine[..])
                    .write_packed_command(&mut self.request);
                self.commands += 1;
            }
        }
        for mine in mine.into_iter().flatten() {
            // Only our key: another writer's stays.
            redis::cmd("EVAL")
                .arg(DELETE_IF_OWNER_SCRIPT)
                .arg(2)
                .arg(&key)
                .arg(&self.registry)
                .arg(&mine[..])
                .arg(&**id)
                .write_packed_command(&mut self.request);
            self.commands += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_set_encoding_is_the_packed_command() {
        let record = RedisRecord {
            generation: 3,
            ..RedisRecord::default()
        };
        let key = engine_key("p:", "engine-7");
        let mut ours = set_head(&key);
        ours.extend_from_slice(&record.encode());
        ours.extend_from_slice(&set_tail(2000));
        let theirs = redis::cmd("SET")
            .arg(&key)
            .arg(&record.encode()[..])
            .arg("PX")
            .arg(2000u32)
            .get_packed_command();
        assert_eq!(ours, theirs);
    }

    #[test]
    fn a_key_is_held_for_half_of_what_the_ttl_leaves_after_the_timeout() {
        let ms = Duration::from_millis;
        // The defaults (ttl_ms 2000, a writer's timeout_ms 1000).
        assert_eq!(hold_for(ms(2000), ms(1000)), ms(500));
        assert_eq!(hold_for(ms(4000), ms(1000)), ms(1500));
        assert_eq!(hold_for(ms(4000), ms(10)), ms(1995));
        // A plain SET sent at the end of the hold and run a whole timeout
        // later runs before the key expires, with half the rest to spare.
        for (ttl, timeout) in [(2000, 1000), (4000, 1000), (500, 100), (60_000, 59_999)] {
            let (ttl, timeout) = (ms(ttl), ms(timeout));
            let hold = hold_for(ttl, timeout);
            assert!(hold + timeout < ttl, "{ttl:?} {timeout:?}");
            assert_eq!(ttl - (hold + timeout), hold, "{ttl:?} {timeout:?}");
        }
        // No time left: no hold, every write runs the owner check.
        assert_eq!(hold_for(ms(1000), ms(1000)), Duration::ZERO);
        assert_eq!(hold_for(ms(500), ms(1000)), Duration::ZERO);

        let target = |uri: &str| RedisTarget::parse(uri).unwrap();
        let encoder = |uri: &str| PipelineEncoder::new(&target(uri), Ownership::Claimed).hold_for;
        assert_eq!(encoder("redis://h/0"), ms(500));
        assert_eq!(encoder("redis://h/0?ttl_ms=3000&timeout_ms=200"), ms(1400));
        assert_eq!(encoder("redis://h/0?ttl_ms=1000"), Duration::ZERO);
    }
}
