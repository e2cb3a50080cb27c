//! The Redis source: every engine of one key prefix, in one round trip per
//! read (DESIGN §7, docs/REDIS.md).

use std::sync::Arc;
use std::time::{Duration, Instant};

use engine_state_shm_format::{monotonic_ns, EngineId};
use redis::{ConnectionLike, Value};

use crate::error::{EngineError, Error};
use crate::redis_fetch::{decode_fetched, heartbeat_age_at_fetch, record_state};
use crate::redis_schema::{engine_key, registry_key, RedisRecord, RECORD_SIZE};
use crate::redis_target::RedisTarget;
use crate::source::{ReaderOptions, Source};
use crate::state::{EngineState, Reading};

/// How long a registered engine whose key expired is still listed (as dead)
/// before this reader removes it from the registry.
pub const PRUNE_AFTER: Duration = Duration::from_secs(30);
/// First wait before reconnecting after a failure; doubles up to [`RECONNECT_CAP`].
pub const RECONNECT_FIRST: Duration = Duration::from_millis(50);
/// Longest wait between two reconnection attempts.
pub const RECONNECT_CAP: Duration = Duration::from_secs(5);

/// Every engine published under one key prefix of one Redis server.
///
/// A read is one pipeline: `SMEMBERS <prefix>engines` (at most every
/// [`ReaderOptions::rescan_interval`]), then per engine key a
/// `GETRANGE key 0 192` (at most one byte more than a record: a huge foreign
/// value costs no more than a record, and is that engine's error) and a
/// `PTTL`. Only when the registry names a new engine does a read take a
/// second round trip (to fetch it at once). Every connection attempt and
/// reply waits at most [`RedisTarget::timeout`] (`?timeout_ms=`, default
/// [`crate::READ_TIMEOUT`], 500 ms).
///
/// Staleness uses no clock of another host: the time since a record was
/// written is `ttl_ms - PTTL` (the server's clock) plus the writer's own
/// write delay (the writer's clock); from then on this reader's clock counts,
/// and it only restarts when the record's heartbeat counter advances. A key
/// that expired on the server is a dead engine. When Redis is unreachable the
/// engines already known are still reported — their heartbeat ages grow, so
/// they turn stale — with the connection error in [`Reading::errors`].
pub struct RedisSource {
    target: RedisTarget,
    options: ReaderOptions,
    registry: String,
    con: Option<redis::Connection>,
    engines: Vec<Tracked>,
    /// `GETRANGE` and `PTTL` of every engine key (rebuilt when the registry
    /// changes).
    packed: Vec<u8>,
    last_scan: Option<Instant>,
    prune: Vec<Arc<str>>,
    retry_at: Instant,
    backoff: Duration,
    connection_error: Option<EngineError>,
}

#[derive(Debug)]
struct Tracked {
    id: Arc<str>,
    key: String,
    seen: Option<Seen>,
    missing_since: Option<Instant>,
    fault: Option<EngineError>,
    /// The registry member is not a valid engine id (its fault is permanent).
    invalid_id: bool,
}

#[derive(Clone, Copy, Debug)]
struct Seen {
    record: RedisRecord,
    /// This reader's estimate of when the last heartbeat happened.
    heartbeat_at: Instant,
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
    /// failures are errors here (later they only make engines stale).
    pub fn open(target: RedisTarget, options: ReaderOptions) -> Result<RedisSource, Error> {
        let target = target.for_reading();
        let con = target.connect()?;
        let mut source = RedisSource {
            registry: registry_key(target.prefix()),
            target,
            options,
            con: Some(con),
            engines: Vec::new(),
            packed: Vec::new(),
            last_scan: None,
            prune: Vec::new(),
            retry_at: Instant::now(),
            backoff: RECONNECT_FIRST,
            connection_error: None,
        };
        source.fetch(Instant::now())?;
        Ok(source)
    }

    /// The server, database and prefix read.
    pub fn target(&self) -> &RedisTarget {
        &self.target
    }

    /// Brings the engines up to date, or records why that failed.
    fn refresh(&mut self, now: Instant) {
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
                self.backoff = RECONNECT_FIRST;
                self.connection_error = None;
            }
            Err(error) => self.failed(now, error),
        }
    }

    fn failed(&mut self, now: Instant, error: Error) {
        self.con = None;
        self.retry_at = now + self.backoff;
        self.backoff = (self.backoff * 2).min(RECONNECT_CAP);
        self.connection_error = Some(EngineError::new(self.target.to_string(), error));
    }

    /// One round trip (two when the registry names a new engine).
    fn fetch(&mut self, now: Instant) -> Result<(), Error> {
        let scan = self
            .last_scan
            .is_none_or(|t| now.duration_since(t) >= self.options.rescan_interval);
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
            let fault = EngineId::new(&id).err().map(|e| {
                EngineError::new(
                    id.clone(),
                    Error::ForeignValue {
                        key: self.registry.clone(),
                        what: format!("member {id:?} is not an engine id: {e}"),
                    },
                )
            });
            self.engines.push(Tracked {
                key: engine_key(self.target.prefix(), &id),
                id: Arc::from(id),
                seen: None,
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

impl Tracked {
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
                self.seen = None;
                self.missing_since = None;
                self.fault = Some(EngineError::new(self.id.to_string(), error));
                return;
            }
        };
        self.fault = None;
        self.missing_since = None;
        let advanced = self.seen.is_none_or(|s| {
            (s.record.generation, s.record.heartbeat_seq)
                != (record.generation, record.heartbeat_seq)
        });
        let heartbeat_at = match self.seen {
            Some(seen) if !advanced => seen.heartbeat_at,
            // Estimated once per new heartbeat: from then on this reader's
            // clock counts (`decode_fetched` made sure 0 <= pttl <= ttl_ms).
            _ => {
                let age = heartbeat_age_at_fetch(&record, pttl);
                now.checked_sub(age).unwrap_or(now)
            }
        };
        self.seen = Some(Seen {
            record,
            heartbeat_at,
        });
    }

    fn state(&self, now: Instant, now_ns: u64, options: &ReaderOptions) -> Option<EngineState> {
        let expired = self.missing_since.is_some();
        let (record, heartbeat_age) = match &self.seen {
            Some(seen) => (Some(&seen.record), now.duration_since(seen.heartbeat_at)),
            None if expired => (None, options.freshness.stale_after),
            None => return None,
        };
        Some(record_state(
            self.id.clone(),
            record,
            heartbeat_age,
            expired,
            &options.freshness,
            now_ns,
        ))
    }
}

impl Source for RedisSource {
    fn read_into(&mut self, out: &mut Reading) -> Result<(), Error> {
        out.clear();
        self.refresh(Instant::now());
        // Ages as of after the refresh (which may have waited on the
        // network), stamped with the same moment: consumers age them from it.
        let now = Instant::now();
        let now_ns = monotonic_ns();
        for engine in &self.engines {
            if let Some(fault) = &engine.fault {
                out.errors.push(fault.clone());
            } else if let Some(state) = engine.state(now, now_ns, &self.options) {
                out.engines.push(state);
            }
        }
        if let Some(error) = &self.connection_error {
            out.errors.push(error.clone());
        }
        Ok(())
    }

    fn uri(&self) -> String {
        self.target.to_string()
    }
}
