//! The Redis source: every engine of one key prefix, in one round trip per
//! read (DESIGN §7, docs/REDIS.md).

use std::sync::Arc;
use std::time::{Duration, Instant};

use engine_state_shm_format::EngineId;
use redis::{ConnectionLike, Value};

use crate::backoff::Backoff;
use crate::error::Error;
use crate::fetch::{decode_fetched, heartbeat_age_at_fetch};
use crate::schema::{engine_key, registry_key, RedisRecord, RECORD_SIZE};
use crate::target::RedisTarget;

/// How long a registered engine whose key expired is still listed (as dead)
/// before this reader removes it from the registry.
pub const PRUNE_AFTER: Duration = Duration::from_secs(30);

/// Every engine published under one key prefix of one Redis server, as this
/// reader last saw it. The reader crate's `RedisSource` turns it into engine
/// states (ages, staleness).
///
/// A refresh is one pipeline: `SMEMBERS <prefix>engines` (at most every
/// `rescan_interval`), then per engine key a
/// `GETRANGE key 0 192` (at most one byte more than a record: a huge foreign
/// value costs no more than a record, and is that engine's error) and a
/// `PTTL`. Only when the registry names a new engine does a refresh take a
/// second round trip (to fetch it at once). Every connection attempt and
/// reply waits at most [`RedisTarget::timeout`] (`?timeout_ms=`, default
/// [`crate::READ_TIMEOUT`], 500 ms).
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
    engines: Vec<RegisteredEngine>,
    /// `GETRANGE` and `PTTL` of every engine key (rebuilt when the registry
    /// changes).
    packed: Vec<u8>,
    last_scan: Option<Instant>,
    prune: Vec<Arc<str>>,
    retry_at: Instant,
    backoff: Backoff,
    connection_error: Option<Error>,
}

/// An engine the registry names, and what its key held at the last refresh.
#[derive(Debug)]
struct RegisteredEngine {
    id: Arc<str>,
    key: String,
    last_record: Option<LastRecord>,
    missing_since: Option<Instant>,
    fault: Option<Error>,
    /// The registry member is not a valid engine id (its fault is permanent).
    invalid_id: bool,
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
    /// Why the engine cannot be read (a foreign value, a key without expiry,
    /// an invalid id); then the other fields say nothing.
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
    /// Connects and reads the registry; connection and authentication
    /// failures are errors here (later they only make engines stale). The
    /// registry is read again at most every `rescan_interval`.
    pub fn open(target: RedisTarget, rescan_interval: Duration) -> Result<RedisSource, Error> {
        let target = target.for_reading();
        let con = target.connect()?;
        let mut source = RedisSource {
            registry: registry_key(target.prefix()),
            target,
            rescan_interval,
            con: Some(con),
            engines: Vec::new(),
            packed: Vec::new(),
            last_scan: None,
            prune: Vec::new(),
            retry_at: Instant::now(),
            backoff: Backoff::default(),
            connection_error: None,
        };
        source.fetch(Instant::now())?;
        Ok(source)
    }

    /// The server, database and prefix read.
    pub fn target(&self) -> &RedisTarget {
        &self.target
    }

    /// Every engine the registry names, sorted by id.
    pub fn engines(&self) -> impl Iterator<Item = EngineView<'_>> {
        self.engines.iter().map(|engine| EngineView {
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

    /// Brings the engines up to date, or records why that failed.
    pub fn refresh(&mut self, now: Instant) {
        if self.con.is_none() {
            if now < self.retry_at {
                return;
            }
            match self.target.connect() {
                Ok(con) => self.con = Some(con),
                Err(error) => return self.failed(now, error),
            }
        }
        match self.fetch(now) {
            Ok(()) => {
                self.backoff.succeeded();
                self.connection_error = None;
            }
            Err(error) => self.failed(now, error),
        }
    }

    fn failed(&mut self, now: Instant, error: Error) {
        self.con = None;
        self.retry_at = now + self.backoff.failed();
        self.connection_error = Some(error);
    }

    /// One round trip (two when the registry names a new engine).
    fn fetch(&mut self, now: Instant) -> Result<(), Error> {
        let scan = self
            .last_scan
            .is_none_or(|t| now.duration_since(t) >= self.rescan_interval);
        let mut request = Vec::with_capacity(self.packed.len() + 64);
        let mut count = 0;
        if scan {
            request.extend(
                redis::cmd("SMEMBERS")
                    .arg(&self.registry)
                    .get_packed_command(),
            );
            count += 1;
        }
        let pruning = !self.prune.is_empty();
        if pruning {
            let mut srem = redis::cmd("SREM");
            srem.arg(&self.registry);
            for id in self.prune.drain(..) {
                srem.arg(&*id);
            }
            request.extend(srem.get_packed_command());
            count += 1;
        }
        request.extend_from_slice(&self.packed);
        count += self.value_commands();
        if count == 0 {
            return Ok(());
        }
        let mut replies = self.query(&request, count)?.into_iter();
        let members = if scan {
            Some(replies.next().unwrap_or(Value::Nil))
        } else {
            None
        };
        if pruning {
            replies.next(); // the SREM's reply
        }
        self.apply_values(replies, now)?;
        if let Some(members) = members {
            self.last_scan = Some(now);
            if self.apply_members(members)? {
                let packed = std::mem::take(&mut self.packed);
                let replies = self.query(&packed, self.value_commands());
                self.packed = packed;
                self.apply_values(replies?.into_iter(), now)?;
            }
        }
        Ok(())
    }

    fn value_commands(&self) -> usize {
        2 * self.engines.len()
    }

    fn query(&mut self, request: &[u8], count: usize) -> Result<Vec<Value>, Error> {
        let con = self.con.as_mut().expect("connected before fetch");
        let replies = con
            .req_packed_commands(request, 0, count)
            .map_err(|e| self.target.error("cannot read engines", &e))?;
        // WRONGTYPE concerns one engine's key (a hash where a record should
        // be): that engine's error, not the read's.
        if let Some(Value::ServerError(e)) = replies
            .iter()
            .find(|v| matches!(v, Value::ServerError(e) if e.code() != "WRONGTYPE"))
        {
            let error: redis::RedisError = e.clone().into();
            return Err(self.target.error("cannot read engines", &error));
        }
        Ok(replies)
    }

    /// Applies `GETRANGE` and `PTTL` replies to the engines they were asked for.
    fn apply_values(
        &mut self,
        mut replies: impl Iterator<Item = Value>,
        now: Instant,
    ) -> Result<(), Error> {
        for i in 0..self.engines.len() {
            let value = replies.next();
            let pttl = match replies.next() {
                Some(Value::Int(ms)) => ms,
                other => return Err(self.protocol_error(&other)),
            };
            let Some(value) = value else {
                return Err(self.protocol_error(&None));
            };
            self.engines[i].apply(value, pttl, now);
        }
        let prune = &mut self.prune;
        self.engines.retain(|e| {
            let expired_long_ago = e
                .missing_since
                .is_some_and(|t| now.duration_since(t) >= PRUNE_AFTER);
            if expired_long_ago {
                prune.push(e.id.clone());
            }
            !expired_long_ago
        });
        Ok(())
    }

    /// Applies an `SMEMBERS` reply; true when it named an engine not known before.
    fn apply_members(&mut self, members: Value) -> Result<bool, Error> {
        if let Value::ServerError(e) = members {
            // WRONGTYPE: the registry key holds something else; no engine
            // can be found, so the read as a whole fails.
            let error: redis::RedisError = e.into();
            return Err(self.target.error("cannot read the engine registry", &error));
        }
        let (Value::Set(members) | Value::Array(members)) = members else {
            return Err(self.protocol_error(&Some(members)));
        };
        let mut ids: Vec<String> = members
            .into_iter()
            .filter_map(|m| match m {
                Value::BulkString(bytes) => String::from_utf8(bytes).ok(),
                Value::SimpleString(s) => Some(s),
                _ => None,
            })
            .filter(|id| !self.prune.iter().any(|p| **p == **id))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let mut old = std::mem::take(&mut self.engines);
        let mut added = false;
        for id in ids {
            if let Some(i) = old.iter().position(|e| *e.id == *id) {
                self.engines.push(old.swap_remove(i));
                continue;
            }
            added = true;
            let fault = EngineId::new(&id).err().map(|e| Error::ForeignValue {
                key: self.registry.clone(),
                what: format!("member {id:?} is not an engine id: {e}"),
            });
            self.engines.push(RegisteredEngine {
                key: engine_key(self.target.prefix(), &id),
                id: Arc::from(id),
                last_record: None,
                missing_since: None,
                invalid_id: fault.is_some(),
                fault,
            });
        }
        self.engines.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        let changed = added || !old.is_empty();
        if changed {
            self.packed.clear();
            for engine in &self.engines {
                // One byte more than a record tells "too large" from "a record".
                redis::cmd("GETRANGE")
                    .arg(&engine.key)
                    .arg(0)
                    .arg(RECORD_SIZE)
                    .write_packed_command(&mut self.packed);
                redis::cmd("PTTL")
                    .arg(&engine.key)
                    .write_packed_command(&mut self.packed);
            }
        }
        Ok(added)
    }

    fn protocol_error(&self, got: &Option<Value>) -> Error {
        Error::Redis {
            uri: self.target.to_string(),
            error: format!("unexpected reply {got:?}"),
            hint: "check that the URI names a Redis server (not another service)",
        }
    }
}

impl RegisteredEngine {
    /// Applies one `GETRANGE key 0 RECORD_SIZE` reply and the key's `PTTL`
    /// (-2: no such key, -1: no expiry).
    fn apply(&mut self, value: Value, pttl: i64, now: Instant) {
        if self.invalid_id {
            return;
        }
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
