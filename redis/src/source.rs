//! The Redis source: every engine of one key prefix, in one round trip per
//! read (docs/REDIS.md, "One round trip per read").

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine_state_shm_format::CacheDigest;
use redis::Value;

use crate::backoff::Backoff;
use crate::error::Error;
use crate::fetch::{decode_fetched, heartbeat_age_at_fetch};
use crate::registry::{self, RegistryScan};
use crate::schema::{engine_key, registry_key, RedisRecord, RECORD_SIZE};
use crate::target::{query_by, RedisTarget};

#[path = "source_cache.rs"]
mod cache;

pub use self::cache::CacheFault;

/// How long a registered engine whose key is missing is still listed (as
/// dead) before this reader removes it from the registry.
pub const PRUNE_AFTER: Duration = Duration::from_secs(30);

/// How many registry members one read asks for (`SSCAN … COUNT`), and the
/// most ids one `SREM` prunes: what bounds the registry's share of a read
/// whatever the registry's size (docs/REDIS.md, "A registry flood").
pub const SCAN_STEP: usize = 1000;

/// Every engine published under one key prefix of one Redis server, as this
/// reader last saw it. The reader crate's `RedisSource` turns it into engine
/// states (ages, staleness).
///
/// A refresh is one pipeline: one step of a scan of the registry
/// (`SSCAN <prefix>engines cursor COUNT 1000`, [`SCAN_STEP`]; a scan starts
/// at most every `rescan_interval` and goes on with one step per refresh
/// until its cursor is back at 0), then per engine whose key held a value
/// at the last refresh a `GETRANGE key 0 192` (at most one byte more than a
/// record: a huge foreign value costs no more than a record, and is that
/// engine's error) and a `PTTL`. Members the step names that are new, or
/// whose key was missing, are fetched in a second round trip (so a new
/// engine shows up at once); a member whose key is missing is not fetched
/// again until the scan comes back to it, and is pruned after
/// [`PRUNE_AFTER`]. So a read costs O(engines with keys + [`SCAN_STEP`])
/// whatever the registry holds. Connecting and every reply of a refresh
/// share one deadline, [`RedisTarget::timeout`] (`?timeout_ms=`, default
/// [`crate::READ_TIMEOUT`], 500 ms) from the refresh's start.
///
/// Staleness uses no clock of another host: the time since a record was
/// written is `ttl_ms - PTTL` (the server's clock) plus the writer's own
/// write delay (the writer's clock); from then on this reader's clock counts,
/// and it only restarts when the record's heartbeat counter advances
/// ([`EngineView::heartbeat_at`]). A key that expired on the server is a dead
/// engine. When Redis is unreachable the engines already known are still
/// listed, with the connection error in [`RedisSource::connection_error`].
pub struct RedisSource {
    target: RedisTarget,
    rescan_interval: Duration,
    registry: String,
    con: Option<redis::Connection>,
    /// Every valid member seen in the registry, by id (a map: a rescan of
    /// 100 000 members must not be quadratic).
    engines: BTreeMap<Arc<str>, RegisteredEngine>,
    /// The engines fetched on every refresh ([`Class::Live`]), each with
    /// its packed `GETRANGE` and `PTTL`; kept up to date engine by engine
    /// ([`RedisSource::index`]) so a read never walks the registry.
    live: BTreeMap<Arc<str>, Vec<u8>>,
    /// The engines [`RedisSource::engines`] lists ([`Class::Live`] and
    /// [`Class::Dead`]).
    listed: BTreeSet<Arc<str>>,
    /// How many engines are [`Class::NoKey`] (counted, not listed).
    no_key: usize,
    /// The registry scan in progress, if any.
    scan: Option<RegistryScan>,
    last_scan_start: Option<Instant>,
    /// Members to fetch once (new, or their key was missing).
    probe: Vec<Arc<str>>,
    /// Engines due for `SREM`, and whether this reader may prune.
    pruning: registry::Pruning,
    /// What the last complete scan found that is not an engine id.
    invalid_members: Option<Error>,
    retry_at: Instant,
    backoff: Backoff,
    connection_error: Option<Error>,
    /// Fetch the cache digests the records name
    /// ([`RedisSource::read_cache_digests`]).
    cache_digests: bool,
    /// Refreshes so far (a digest fault found by the last one is reported
    /// with its read).
    refreshes: u64,
}

/// An engine the registry names, and what its key held at the last refresh.
#[derive(Debug)]
struct RegisteredEngine {
    id: Arc<str>,
    key: String,
    last_record: Option<LastRecord>,
    missing_since: Option<Instant>,
    fault: Option<Error>,
    /// Fetched at least once (an engine not yet fetched is not listed).
    fetched_once: bool,
    /// Queued for, or in, an `SREM` (see [`RedisSource::pruning`]).
    prune_pending: bool,
    /// The engine's cache digest (fetched only with
    /// [`RedisSource::read_cache_digests`]).
    cache: cache::CacheSlot,
}

/// Where an engine is indexed (see [`RegisteredEngine::class`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// Registered, not fetched yet: neither fetched every refresh nor listed.
    Unfetched,
    /// Its key held a value (a record or a fault): fetched every refresh, listed.
    Live,
    /// Its key went away after a record was read: listed (dead), not fetched.
    Dead,
    /// No record was ever read and the key is missing: a registered id that
    /// was never written (or a junk `SADD`): counted, not listed, not fetched.
    NoKey,
}

/// The last record read of an engine and when its heartbeat happened.
#[derive(Clone, Copy, Debug)]
struct LastRecord {
    record: RedisRecord,
    /// This reader's estimate of when the last heartbeat happened.
    heartbeat_at: Instant,
}

/// One engine as a [`RedisSource`] last saw it.
#[derive(Clone, Copy, Debug)]
pub struct EngineView<'a> {
    /// The engine id (the registry member).
    pub id: &'a Arc<str>,
    /// Why the engine cannot be read (a foreign value, a key without
    /// expiry); then the other fields say nothing.
    pub fault: Option<&'a Error>,
    /// The last record read (None: none yet, or the key expired before one was).
    pub record: Option<&'a RedisRecord>,
    /// This reader's estimate of when the record's heartbeat happened
    /// (`Some` exactly when `record` is).
    pub heartbeat_at: Option<Instant>,
    /// The key expired on the server's clock: the writer is gone.
    pub expired: bool,
    /// The engine's cache digest, for the record's generation and at least
    /// the `cache_version` it names ([`RedisSource::read_cache_digests`];
    /// the same `Arc` until that version moves).
    pub cache: Option<&'a Arc<CacheDigest>>,
    /// Why the digest the record names is not used: a value that is not a
    /// digest (at every read), or none there for this record (missing,
    /// another run, older: with the refresh that found it only).
    pub cache_fault: Option<CacheFault<'a>>,
}

impl std::fmt::Debug for RedisSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSource")
            .field("target", &self.target)
            .field("connected", &self.con.is_some())
            .field("engines", &self.engines.len())
            .finish_non_exhaustive()
    }
}

impl RedisSource {
    /// Connects and reads the registry (its first [`SCAN_STEP`] members);
    /// connection and authentication failures are errors here (later they
    /// only make engines stale), all within one [`RedisTarget::timeout`].
    /// The registry is scanned again at most every `rescan_interval`.
    pub fn open(target: RedisTarget, rescan_interval: Duration) -> Result<RedisSource, Error> {
        let target = target.for_reading();
        let now = Instant::now();
        let deadline = now + target.timeout();
        let con = target.connect_by(deadline)?;
        let mut source = RedisSource::unconnected(target, rescan_interval, now);
        source.connected(con);
        source.fetch(now, deadline)?;
        Ok(source)
    }

    /// A source with no connection yet (`open` connects it; unit tests feed
    /// it replies).
    fn unconnected(target: RedisTarget, rescan_interval: Duration, now: Instant) -> RedisSource {
        RedisSource {
            registry: registry_key(target.prefix()),
            target,
            rescan_interval,
            con: None,
            engines: BTreeMap::new(),
            live: BTreeMap::new(),
            listed: BTreeSet::new(),
            no_key: 0,
            scan: None,
            last_scan_start: None,
            probe: Vec::new(),
            pruning: registry::Pruning::new(PRUNE_AFTER),
            invalid_members: None,
            retry_at: now,
            backoff: Backoff::default(),
            connection_error: None,
            cache_digests: false,
            refreshes: 0,
        }
    }

    /// Uses a new connection. A scan in progress is dropped: its cursor
    /// means nothing to a server that restarted (or another one behind the
    /// same address), and ending it there would drop live engines.
    fn connected(&mut self, con: redis::Connection) {
        self.con = Some(con);
        self.scan = None;
        self.last_scan_start = None;
    }

    /// How long an engine whose key is missing stays registered (tests
    /// shorten [`PRUNE_AFTER`]).
    #[doc(hidden)]
    pub fn set_prune_after(&mut self, prune_after: Duration) {
        self.pruning.after = prune_after;
    }

    /// Whether refreshes also fetch the engines' cache digests (default
    /// off): a digest is fetched (`GETRANGE <prefix>cache:<id> 0`
    /// [`crate::CACHE_FETCH_END`], size-bounded) only for an engine whose
    /// record names a `cache_version` past the one held, in one more round
    /// trip after the records' when any is needed.
    pub fn read_cache_digests(&mut self, on: bool) {
        self.cache_digests = on;
    }

    /// The server, database and prefix read.
    pub fn target(&self) -> &RedisTarget {
        &self.target
    }

    /// Every engine the registry names whose key held a value when fetched
    /// (now, or before it went away), sorted by id; registered ids whose key
    /// was never seen are only counted ([`RedisSource::unkeyed_members`]).
    pub fn engines(&self) -> impl Iterator<Item = EngineView<'_>> {
        self.listed
            .iter()
            .map(|id| &self.engines[id])
            .map(|engine| EngineView {
                id: &engine.id,
                fault: engine.fault.as_ref(),
                record: engine.last_record.as_ref().map(|r| &r.record),
                heartbeat_at: engine.last_record.map(|r| r.heartbeat_at),
                expired: engine.missing_since.is_some(),
                cache: engine.last_record.as_ref().and_then(|r| {
                    engine
                        .cache
                        .digest(r.record.generation, r.record.snapshot.cache_version)
                }),
                cache_fault: engine.last_record.as_ref().and_then(|r| {
                    engine
                        .cache
                        .fault(r.record.snapshot.cache_version, self.refreshes)
                }),
            })
    }

    /// Why the last refresh could not reach the server (None: it could).
    pub fn connection_error(&self) -> Option<&Error> {
        self.connection_error.as_ref()
    }

    /// Registry members that are not engine ids (one error for all of them,
    /// naming how many and the first), as of the last complete scan: they
    /// are never fetched or listed.
    pub fn invalid_members(&self) -> Option<&Error> {
        self.invalid_members.as_ref()
    }

    /// Registered ids whose key this reader never saw (one error for all of
    /// them, naming how many): they are not listed, and are pruned from the
    /// registry after [`PRUNE_AFTER`] like any engine whose key is gone.
    pub fn unkeyed_members(&self) -> Option<Error> {
        (self.no_key > 0).then(|| Error::ForeignValue {
            key: self.registry.clone(),
            what: format!(
                "{} registered id(s) have no key (never written, or gone before this \
                 reader read one) and are not listed; they are removed from the registry \
                 {} s after this reader found their key missing",
                self.no_key,
                self.pruning.after.as_secs()
            ),
        })
    }

    /// The registry key (`<prefix>engines`), under which
    /// [`RedisSource::invalid_members`] is reported.
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// Brings the engines up to date, or records why that failed. Connecting
    /// and every reply share one deadline, [`RedisTarget::timeout`] from now;
    /// after a failure the backoff counts from when the wait ended.
    pub fn refresh(&mut self, now: Instant) {
        let deadline = now + self.target.timeout();
        if self.con.is_none() {
            if now < self.retry_at {
                return;
            }
            match self.target.connect_by(deadline) {
                Ok(con) => self.connected(con),
                Err(error) => return self.failed(error),
            }
        }
        match self.fetch(now, deadline) {
            Ok(()) => {
                self.backoff.succeeded();
                self.connection_error = None;
            }
            Err(error) => self.failed(error),
        }
    }

    fn failed(&mut self, error: Error) {
        self.con = None;
        // From now, after the wait that failed: a backoff measured from
        // before it would have passed already, and the next read would
        // wait again.
        self.retry_at = Instant::now() + self.backoff.failed();
        self.connection_error = Some(error);
    }

    /// One round trip (two when the registry step names members to fetch).
    fn fetch(&mut self, now: Instant, deadline: Instant) -> Result<(), Error> {
        self.refreshes += 1;
        if self.scan.is_none()
            && self
                .last_scan_start
                .is_none_or(|t| now.duration_since(t) >= self.rescan_interval)
        {
            self.scan = Some(RegistryScan::default());
            self.last_scan_start = Some(now);
        }
        let mut request = Vec::new();
        let (pruning, mut count) = registry::pack_registry(
            &self.registry,
            &mut self.pruning.due,
            self.scan.as_ref(),
            &mut request,
        );
        let fetched: Vec<Arc<str>> = self
            .live
            .iter()
            .map(|(id, packed)| {
                request.extend_from_slice(packed);
                id.clone()
            })
            .collect();
        count += 2 * fetched.len();
        // Members a failed refresh did not get to fetch.
        let probing = self.take_probes();
        count += self.pack_probes(&probing, &mut request);
        if count == 0 {
            return Ok(());
        }
        // The SREM's reply is checked apart: a reader that may not write
        // still reads.
        let srem_reply = (!pruning.is_empty()).then_some(0);
        let mut replies = match self.query(&request, count, srem_reply, deadline) {
            Ok(replies) => replies.into_iter(),
            Err(error) => {
                self.probe = probing;
                self.pruning.due.extend(pruning);
                return Err(error);
            }
        };
        if !pruning.is_empty() {
            let reply = replies.next();
            self.apply_srem(pruning, reply)?;
        }
        let step = if self.scan.is_some() {
            Some(replies.next().unwrap_or(Value::Nil))
        } else {
            None
        };
        self.apply_values(&fetched, &mut replies, now)?;
        self.apply_values(&probing, &mut replies, now)?;
        if let Some(step) = step {
            self.apply_step(step)?;
            if !self.probe.is_empty() {
                let probing = self.take_probes();
                let mut request = Vec::new();
                let count = self.pack_probes(&probing, &mut request);
                let mut replies = match self.query(&request, count, None, deadline) {
                    Ok(replies) => replies.into_iter(),
                    Err(error) => {
                        self.probe = probing;
                        return Err(error);
                    }
                };
                self.apply_values(&probing, &mut replies, now)?;
            }
        }
        self.fetch_digests(deadline);
        Ok(())
    }

    /// Applies the `SREM` of `ids`: removed from the registry, they leave
    /// this reader too. A server that refuses writes (`NOPERM`, `READONLY`)
    /// ends pruning; they stay listed as dead. Any other failure puts them
    /// back for the next refresh.
    fn apply_srem(&mut self, ids: Vec<Arc<str>>, reply: Option<Value>) -> Result<(), Error> {
        let engines = &mut self.engines;
        let removed = self.pruning.apply_srem(
            ids,
            reply,
            &self.target,
            &self.registry,
            ("engines", "dead", "cannot prune the engine registry"),
            |id| {
                if let Some(engine) = engines.get_mut(id) {
                    engine.prune_pending = false;
                }
            },
        )?;
        for id in &removed {
            self.remove_engine(id);
        }
        Ok(())
    }

    /// Removes an engine from this reader (it left the registry).
    fn remove_engine(&mut self, id: &Arc<str>) {
        if let Some(engine) = self.engines.remove(id) {
            self.index(id, Some(engine.class()), None);
        }
    }

    /// Moves `id` in the indexes from `before` to `after` (None: not
    /// registered); `after`'s engine must be in `engines`.
    fn index(&mut self, id: &Arc<str>, before: Option<Class>, after: Option<Class>) {
        if before == after {
            return;
        }
        match before {
            Some(Class::Live) => {
                self.live.remove(id);
                self.listed.remove(id);
            }
            Some(Class::Dead) => {
                self.listed.remove(id);
            }
            Some(Class::NoKey) => self.no_key -= 1,
            Some(Class::Unfetched) | None => {}
        }
        match after {
            Some(Class::Live) => {
                let mut packed = Vec::new();
                registry::pack_fetch(&self.engines[id].key, RECORD_SIZE, &mut packed);
                self.live.insert(id.clone(), packed);
                self.listed.insert(id.clone());
            }
            Some(Class::Dead) => {
                self.listed.insert(id.clone());
            }
            Some(Class::NoKey) => self.no_key += 1,
            Some(Class::Unfetched) | None => {}
        }
    }

    /// The members to fetch once that are still registered.
    fn take_probes(&mut self) -> Vec<Arc<str>> {
        let mut probing = std::mem::take(&mut self.probe);
        probing.retain(|id| self.engines.contains_key(id));
        probing
    }

    /// Packs the fetches of `ids` (all registered); returns how many
    /// commands that is.
    fn pack_probes(&self, ids: &[Arc<str>], out: &mut Vec<u8>) -> usize {
        for id in ids {
            registry::pack_fetch(&self.engines[id].key, RECORD_SIZE, out);
        }
        2 * ids.len()
    }

    fn query(
        &mut self,
        request: &[u8],
        count: usize,
        srem_reply: Option<usize>,
        deadline: Instant,
    ) -> Result<Vec<Value>, Error> {
        let con = self.con.as_mut().expect("connected before fetch");
        let replies = query_by(con, request, count, deadline)
            .map_err(|e| self.target.error("cannot read engines", &e))?;
        // The SREM's reply is `apply_srem`'s.
        if let Some(error) = registry::read_error(&replies, srem_reply) {
            return Err(self.target.error("cannot read engines", &error));
        }
        Ok(replies)
    }

    /// Applies the `GETRANGE` and `PTTL` replies of `ids` (two each, in
    /// order), re-indexes the engines whose keys appeared or went away, and
    /// queues those due for pruning.
    fn apply_values(
        &mut self,
        ids: &[Arc<str>],
        replies: &mut impl Iterator<Item = Value>,
        now: Instant,
    ) -> Result<(), Error> {
        for id in ids {
            let (value, pttl) = registry::next_fetched(replies, &self.target)?;
            let Some(engine) = self.engines.get_mut(id) else {
                continue; // pruned earlier in this pipeline
            };
            let before = engine.class();
            engine.apply(value, pttl, now);
            let after = engine.class();
            self.pruning
                .queue_if_due(id, &mut engine.prune_pending, engine.missing_since, now);
            self.index(id, Some(before), Some(after));
        }
        Ok(())
    }

    /// Applies one `SSCAN` reply: new members and members whose key was
    /// missing are fetched next; at the end of the scan, engines it did not
    /// see have left the registry.
    fn apply_step(&mut self, step: Value) -> Result<(), Error> {
        let scan = self
            .scan
            .as_mut()
            .expect("a step is only sent during a scan");
        // WRONGTYPE: the registry key holds something else; no engine can
        // be found, so the read as a whole fails.
        let done = scan.apply_step(
            step,
            &self.target,
            "cannot read the engine registry",
            |id| match self.engines.get(&id) {
                Some(engine) if engine.prune_pending => {} // its SREM is on the way
                Some(engine) if engine.class() == Class::Live => {}
                Some(_) => self.probe.push(id),
                None => {
                    self.engines.insert(
                        id.clone(),
                        RegisteredEngine {
                            key: engine_key(self.target.prefix(), &id),
                            id: id.clone(),
                            last_record: None,
                            missing_since: None,
                            fault: None,
                            fetched_once: false,
                            prune_pending: false,
                            cache: cache::CacheSlot::default(),
                        },
                    );
                    self.probe.push(id);
                }
            },
        )?;
        if done {
            let scan = self.scan.take().expect("scanning");
            let (gone, invalid) = scan.finish(self.engines.keys(), &self.registry, "engine ids");
            for id in &gone {
                self.remove_engine(id);
            }
            self.invalid_members = invalid;
        }
        Ok(())
    }
}

impl RegisteredEngine {
    /// Where this engine is indexed.
    fn class(&self) -> Class {
        if !self.fetched_once {
            Class::Unfetched
        } else if self.missing_since.is_none() {
            Class::Live
        } else if self.last_record.is_some() {
            Class::Dead
        } else {
            Class::NoKey
        }
    }

    /// Applies one `GETRANGE key 0 RECORD_SIZE` reply and the key's `PTTL`
    /// (-2: no such key, -1: no expiry).
    fn apply(&mut self, value: Value, pttl: i64, now: Instant) {
        self.fetched_once = true;
        if pttl == -2 {
            // Expired on the server's clock (GETRANGE reads a missing key as
            // ""): the writer stopped.
            self.fault = None;
            self.missing_since.get_or_insert(now);
            return;
        }
        let decoded = registry::fetched_bytes(&self.key, value).and_then(|bytes| {
            if bytes.len() > RECORD_SIZE {
                return Err(Error::ForeignValue {
                    key: self.key.clone(),
                    what: format!(
                        "a value larger than a {RECORD_SIZE}-byte record (only its first \
                         {} bytes were read)",
                        RECORD_SIZE + 1
                    ),
                });
            }
            decode_fetched(&self.key, &bytes, pttl)
        });
        let record = match decoded {
            Ok(record) => record,
            Err(error) => {
                self.last_record = None;
                self.missing_since = None;
                self.fault = Some(error);
                return;
            }
        };
        self.fault = None;
        self.missing_since = None;
        let advanced = self.last_record.is_none_or(|s| {
            (s.record.generation, s.record.heartbeat_seq)
                != (record.generation, record.heartbeat_seq)
        });
        let heartbeat_at = match self.last_record {
            Some(last) if !advanced => last.heartbeat_at,
            _ => {
                let age = heartbeat_age_at_fetch(&record, pttl);
                now.checked_sub(age).unwrap_or(now)
            }
        };
        self.last_record = Some(LastRecord {
            record,
            heartbeat_at,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source() -> RedisSource {
        let target = RedisTarget::parse("redis://127.0.0.1:1/0").unwrap();
        let mut source = RedisSource::unconnected(target, Duration::ZERO, Instant::now());
        source.scan = Some(RegistryScan::default());
        source
    }

    fn step(cursor: u64, members: &[&[u8]]) -> Value {
        Value::Array(vec![
            Value::BulkString(cursor.to_string().into_bytes()),
            Value::Array(
                members
                    .iter()
                    .map(|m| Value::BulkString(m.to_vec()))
                    .collect(),
            ),
        ])
    }

    /// The GETRANGE and PTTL replies of a missing key.
    fn missing() -> Vec<Value> {
        vec![Value::BulkString(Vec::new()), Value::Int(-2)]
    }

    #[test]
    fn invalid_members_are_counted_once_each_and_non_utf8_is_invalid() {
        let mut source = source();
        // SSCAN may return a member in two steps.
        source
            .apply_step(step(7, &[b"bad one", b"\xff\xfe"]))
            .unwrap();
        source
            .apply_step(step(0, &[b"bad one", b"\xff\xfe"]))
            .unwrap();
        let error = source.invalid_members().unwrap().to_string();
        assert!(error.contains("2 member(s) are not engine ids"), "{error}");
        // Not UTF-8 alone: reported, not dropped in silence.
        source.scan = Some(RegistryScan::default());
        source.apply_step(step(0, &[b"\xff"])).unwrap();
        let error = source.invalid_members().unwrap().to_string();
        assert!(
            error.contains("1 member(s)") && error.contains("not UTF-8"),
            "{error}"
        );
    }

    #[test]
    fn a_registered_id_never_written_is_counted_not_listed() {
        let mut source = source();
        source.apply_step(step(0, &[b"junk1", b"junk2"])).unwrap();
        let probing = source.take_probes();
        let replies = [missing(), missing()].concat();
        source
            .apply_values(&probing, &mut replies.into_iter(), Instant::now())
            .unwrap();
        assert_eq!(source.engines().count(), 0);
        assert!(source.live.is_empty());
        let error = source.unkeyed_members().unwrap().to_string();
        assert!(error.contains("2 registered id(s) have no key"), "{error}");
    }

    /// An id due for pruning is not re-added by a scan step before its
    /// SREM's reply, and leaves only once the SREM succeeded.
    #[test]
    fn an_id_pending_srem_is_not_re_added_and_leaves_once_removed() {
        let mut source = source();
        source.set_prune_after(Duration::ZERO);
        source.apply_step(step(0, &[b"gone"])).unwrap();
        let probing = source.take_probes();
        let now = Instant::now();
        source
            .apply_values(&probing, &mut missing().into_iter(), now)
            .unwrap();
        assert_eq!(source.pruning.due, [Arc::<str>::from("gone")]);
        source.scan = Some(RegistryScan::default());
        source.apply_step(step(0, &[b"gone"])).unwrap();
        assert!(source.probe.is_empty(), "{:?}", source.probe);
        assert!(source.engines.contains_key("gone"));
        let ids = std::mem::take(&mut source.pruning.due);
        source.apply_srem(ids, Some(Value::Int(1))).unwrap();
        assert!(source.engines.is_empty());
        assert!(source.unkeyed_members().is_none());
    }

    /// A reader that may not write keeps reading: the engine stays, and
    /// pruning stops.
    #[test]
    fn a_refused_srem_stops_pruning_and_keeps_the_engine() {
        let mut source = source();
        source.set_prune_after(Duration::ZERO);
        source.apply_step(step(0, &[b"gone"])).unwrap();
        let probing = source.take_probes();
        source
            .apply_values(&probing, &mut missing().into_iter(), Instant::now())
            .unwrap();
        let ids = std::mem::take(&mut source.pruning.due);
        let refused = redis::parse_redis_value(
            b"-NOPERM User r has no permissions to run the 'srem' command\r\n",
        )
        .unwrap();
        assert!(matches!(refused, Value::ServerError(_)), "{refused:?}");
        source.apply_srem(ids, Some(refused)).unwrap();
        assert!(source.pruning.refused);
        assert!(source.engines.contains_key("gone"));
        let probing: Vec<Arc<str>> = vec![Arc::from("gone")];
        source
            .apply_values(&probing, &mut missing().into_iter(), Instant::now())
            .unwrap();
        assert!(source.pruning.due.is_empty(), "no SREM again");
    }
}
