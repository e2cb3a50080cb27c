//! The Redis source: every engine of one key prefix, in one round trip per
//! read (DESIGN §7, docs/REDIS.md).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine_state_shm_format::EngineId;
use redis::Value;

use crate::backoff::Backoff;
use crate::error::Error;
use crate::fetch::{decode_fetched, heartbeat_age_at_fetch};
use crate::schema::{engine_key, registry_key, RedisRecord, RECORD_SIZE};
use crate::target::{query_by, RedisTarget};

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
    /// The engines fetched on every refresh, in the order of `packed`.
    fetched: Vec<Arc<str>>,
    /// `GETRANGE` and `PTTL` of every engine of `fetched`.
    packed: Vec<u8>,
    /// `fetched` and `packed` must be rebuilt (an engine's key appeared or
    /// went away, or the engine left the registry).
    repack: bool,
    /// The registry scan in progress, if any.
    scan: Option<RegistryScan>,
    last_scan_start: Option<Instant>,
    /// Members to fetch once (new, or their key was missing).
    probe: Vec<Arc<str>>,
    prune: Vec<Arc<str>>,
    /// What the last complete scan found that is not an engine id.
    invalid_members: Option<Error>,
    retry_at: Instant,
    backoff: Backoff,
    connection_error: Option<Error>,
}

/// One pass over the registry, a [`SCAN_STEP`] at a time.
#[derive(Default)]
struct RegistryScan {
    /// The `SSCAN` cursor (0: start, or done once a step returned it).
    cursor: u64,
    /// Valid members seen so far: who is not seen by the end left.
    seen: HashSet<Arc<str>>,
    /// Members that are not engine ids: how many, and the first.
    invalid: usize,
    first_invalid: Option<(String, String)>,
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
        let mut source = RedisSource {
            registry: registry_key(target.prefix()),
            target,
            rescan_interval,
            con: Some(con),
            engines: BTreeMap::new(),
            fetched: Vec::new(),
            packed: Vec::new(),
            repack: false,
            scan: None,
            last_scan_start: None,
            probe: Vec::new(),
            prune: Vec::new(),
            invalid_members: None,
            retry_at: now,
            backoff: Backoff::default(),
            connection_error: None,
        };
        source.fetch(now, deadline)?;
        Ok(source)
    }

    /// The server, database and prefix read.
    pub fn target(&self) -> &RedisTarget {
        &self.target
    }

    /// Every engine the registry names that has been fetched, sorted by id.
    pub fn engines(&self) -> impl Iterator<Item = EngineView<'_>> {
        self.engines
            .values()
            .filter(|e| e.fetched_once)
            .map(|engine| EngineView {
                id: &engine.id,
                fault: engine.fault.as_ref(),
                record: engine.last_record.as_ref().map(|r| &r.record),
                heartbeat_at: engine.last_record.map(|r| r.heartbeat_at),
                expired: engine.missing_since.is_some(),
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
                Ok(con) => self.con = Some(con),
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
        if self.scan.is_none()
            && self
                .last_scan_start
                .is_none_or(|t| now.duration_since(t) >= self.rescan_interval)
        {
            self.scan = Some(RegistryScan::default());
            self.last_scan_start = Some(now);
        }
        if self.repack {
            self.repack_fetched();
        }
        let mut request = Vec::with_capacity(self.packed.len() + 64);
        let mut count = 0;
        if let Some(scan) = &self.scan {
            redis::cmd("SSCAN")
                .arg(&self.registry)
                .arg(scan.cursor)
                .arg("COUNT")
                .arg(SCAN_STEP)
                .write_packed_command(&mut request);
            count += 1;
        }
        let pruning = !self.prune.is_empty();
        if pruning {
            let mut srem = redis::cmd("SREM");
            srem.arg(&self.registry);
            let from = self.prune.len().saturating_sub(SCAN_STEP);
            for id in self.prune.drain(from..) {
                srem.arg(&*id);
            }
            srem.write_packed_command(&mut request);
            count += 1;
        }
        request.extend_from_slice(&self.packed);
        count += 2 * self.fetched.len();
        // Members a failed refresh did not get to fetch.
        let probing = self.take_probes();
        count += self.pack_probes(&probing, &mut request);
        if count == 0 {
            return Ok(());
        }
        let mut replies = match self.query(&request, count, deadline) {
            Ok(replies) => replies.into_iter(),
            Err(error) => {
                self.probe = probing;
                return Err(error);
            }
        };
        let step = if self.scan.is_some() {
            Some(replies.next().unwrap_or(Value::Nil))
        } else {
            None
        };
        if pruning {
            replies.next(); // the SREM's reply
        }
        let fetched = std::mem::take(&mut self.fetched);
        let applied = self.apply_values(&fetched, &mut replies, now);
        self.fetched = fetched;
        applied?;
        self.apply_values(&probing, &mut replies, now)?;
        if let Some(step) = step {
            self.apply_step(step)?;
            if !self.probe.is_empty() {
                let probing = self.take_probes();
                let mut request = Vec::new();
                let count = self.pack_probes(&probing, &mut request);
                let mut replies = match self.query(&request, count, deadline) {
                    Ok(replies) => replies.into_iter(),
                    Err(error) => {
                        self.probe = probing;
                        return Err(error);
                    }
                };
                self.apply_values(&probing, &mut replies, now)?;
            }
        }
        Ok(())
    }

    /// `GETRANGE` (one byte more than a record tells "too large" from "a
    /// record") and `PTTL` of `key`.
    fn pack_fetch(key: &str, out: &mut Vec<u8>) {
        redis::cmd("GETRANGE")
            .arg(key)
            .arg(0)
            .arg(RECORD_SIZE)
            .write_packed_command(out);
        redis::cmd("PTTL").arg(key).write_packed_command(out);
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
            Self::pack_fetch(&self.engines[id].key, out);
        }
        2 * ids.len()
    }

    fn repack_fetched(&mut self) {
        self.repack = false;
        self.fetched.clear();
        self.packed.clear();
        for engine in self.engines.values() {
            if engine.fetched_once && engine.missing_since.is_none() {
                self.fetched.push(engine.id.clone());
                Self::pack_fetch(&engine.key, &mut self.packed);
            }
        }
    }

    fn query(
        &mut self,
        request: &[u8],
        count: usize,
        deadline: Instant,
    ) -> Result<Vec<Value>, Error> {
        let con = self.con.as_mut().expect("connected before fetch");
        let replies = query_by(con, request, count, deadline)
            .map_err(|e| self.target.error("cannot read engines", &e))?;
        // WRONGTYPE concerns one engine's key (a hash where a record should
        // be) or the registry (reported by `apply_step`): not the read's.
        if let Some(Value::ServerError(e)) = replies
            .iter()
            .find(|v| matches!(v, Value::ServerError(e) if e.code() != "WRONGTYPE"))
        {
            let error: redis::RedisError = e.clone().into();
            return Err(self.target.error("cannot read engines", &error));
        }
        Ok(replies)
    }

    /// Applies the `GETRANGE` and `PTTL` replies of `ids` (two each, in
    /// order), and notes which engines' keys appeared or went away, and
    /// which to prune.
    fn apply_values(
        &mut self,
        ids: &[Arc<str>],
        replies: &mut impl Iterator<Item = Value>,
        now: Instant,
    ) -> Result<(), Error> {
        for id in ids {
            let value = replies.next();
            let pttl = match replies.next() {
                Some(Value::Int(ms)) => ms,
                other => return Err(self.protocol_error(&other)),
            };
            let Some(value) = value else {
                return Err(self.protocol_error(&None));
            };
            let Some(engine) = self.engines.get_mut(id) else {
                continue; // pruned earlier in this pipeline
            };
            let was_fetched = engine.fetched_once && engine.missing_since.is_none();
            engine.apply(value, pttl, now);
            let is_fetched = engine.missing_since.is_none();
            if was_fetched != is_fetched {
                self.repack = true;
            }
            if engine
                .missing_since
                .is_some_and(|t| now.duration_since(t) >= PRUNE_AFTER)
            {
                self.engines.remove(id);
                self.prune.push(id.clone());
                self.repack = true;
            }
        }
        Ok(())
    }

    /// Applies one `SSCAN` reply: new members and members whose key was
    /// missing are fetched next; at the end of the scan, engines it did not
    /// see have left the registry.
    fn apply_step(&mut self, step: Value) -> Result<(), Error> {
        if let Value::ServerError(e) = step {
            // WRONGTYPE: the registry key holds something else; no engine
            // can be found, so the read as a whole fails.
            let error: redis::RedisError = e.into();
            return Err(self.target.error("cannot read the engine registry", &error));
        }
        let Value::Array(parts) = &step else {
            return Err(self.protocol_error(&Some(step)));
        };
        let (Some(cursor), Some(Value::Array(members) | Value::Set(members))) =
            (parts.first().and_then(text), parts.get(1))
        else {
            return Err(self.protocol_error(&Some(step.clone())));
        };
        let Ok(cursor) = cursor.parse::<u64>() else {
            return Err(self.protocol_error(&Some(step.clone())));
        };
        let scan = self
            .scan
            .as_mut()
            .expect("a step is only sent during a scan");
        for member in members.iter().filter_map(text) {
            if let Err(e) = EngineId::new(&member) {
                scan.invalid += 1;
                scan.first_invalid
                    .get_or_insert_with(|| (member, e.to_string()));
                continue;
            }
            if scan.seen.contains(member.as_str()) {
                continue; // SSCAN may return a member twice
            }
            let id: Arc<str> = Arc::from(member);
            scan.seen.insert(id.clone());
            match self.engines.get(&id) {
                Some(engine) if engine.missing_since.is_none() && engine.fetched_once => {}
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
                        },
                    );
                    self.probe.push(id);
                }
            }
        }
        scan.cursor = cursor;
        if cursor == 0 {
            let scan = self.scan.take().expect("scanning");
            let before = self.engines.len();
            self.engines.retain(|id, _| scan.seen.contains(id));
            if self.engines.len() != before {
                self.repack = true;
            }
            self.invalid_members = scan.first_invalid.map(|(member, why)| Error::ForeignValue {
                key: self.registry.clone(),
                what: format!(
                    "{} member(s) are not engine ids and are skipped, e.g. {member:?}: {why}; \
                     remove them with SREM",
                    scan.invalid
                ),
            });
        }
        Ok(())
    }

    fn protocol_error(&self, got: &Option<Value>) -> Error {
        Error::Redis {
            uri: self.target.to_string(),
            error: format!("unexpected reply {got:?}"),
            hint: "check that the URI names a Redis server (not another service)",
        }
    }
}

/// A registry member or cursor as text (None: not a string).
fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

impl RegisteredEngine {
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
        let decoded = match value {
            Value::BulkString(bytes) if bytes.len() > RECORD_SIZE => Err(Error::ForeignValue {
                key: self.key.clone(),
                what: format!(
                    "a value larger than a {RECORD_SIZE}-byte record (only its first \
                     {} bytes were read)",
                    RECORD_SIZE + 1
                ),
            }),
            Value::BulkString(bytes) => decode_fetched(&self.key, &bytes, pttl),
            Value::ServerError(e) if e.code() == "WRONGTYPE" => Err(Error::ForeignValue {
                key: self.key.clone(),
                what: "the key holds a list, hash, set or other non-string type".to_owned(),
            }),
            other => Err(Error::ForeignValue {
                key: self.key.clone(),
                what: format!("unexpected reply {other:?}"),
            }),
        };
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
