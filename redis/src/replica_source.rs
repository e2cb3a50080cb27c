//! Reading every router replica's reservations under one key prefix
//! (docs/REDIS.md, "Router replicas' reservations"): the registry
//! (`<prefix>routers`) and each replica's value, in one round trip per read.
//!
//! The registry is read the way [`crate::RedisSource`] reads the engines'
//! (docs/REDIS.md, "One round trip per read" and "A registry flood"): one
//! `SSCAN … COUNT 1000` step per read while a scan runs (one starts at most
//! every `rescan_interval`), members that are not replica ids skipped and
//! reported once, new members (and those whose key was missing) fetched in
//! a second round trip, ids whose key is gone pruned after
//! [`crate::PRUNE_AFTER`]. Each replica whose key held a value at the last
//! read is fetched with `GETRANGE key 0 MAX_ROUTER_VALUE_SIZE` (a huge
//! foreign value costs no more than the largest value) and `PTTL`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use crate::backoff::Backoff;
use crate::error::Error;
use crate::fetch::{decode_fetched_router, router_heartbeat_age_at_fetch};
use crate::registry::{self, RegistryScan};
use crate::router_value::{RouterValue, MAX_ROUTER_VALUE_SIZE};
use crate::schema::{router_key, router_registry_key};
use crate::source::PRUNE_AFTER;
use crate::target::{query_by, RedisTarget};

/// How often a scan of the replica registry starts at most by default.
pub const DEFAULT_RESCAN_INTERVAL: Duration = Duration::from_millis(250);

/// One replica's value as read, and its heartbeat's age.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaValue {
    /// The value.
    pub value: RouterValue,
    /// Time since the replica's last write: `ttl_ms - PTTL` by the
    /// server's clock when its `heartbeat_seq` advanced, then this reader's
    /// clock (a value rewritten without a new heartbeat ages).
    pub heartbeat_age: Duration,
}

/// What one [`RedisReplicas::read`] found.
#[derive(Debug, Default)]
pub struct ReplicaReading {
    /// Every registered replica whose key holds a value, sorted by id: its
    /// value and heartbeat age, or why it cannot be used (that replica's
    /// error: a foreign or corrupt value, another layout version, a key
    /// without expiry).
    pub replicas: Vec<(Arc<str>, Result<ReplicaValue, Error>)>,
    /// Registered replicas whose key this reader saw hold a value and that
    /// is gone now (expired: the writer stopped; or RETIRED), sorted by id.
    pub gone: Vec<Arc<str>>,
    /// Registered ids whose key this reader never saw hold a value (never
    /// written, or junk): counted, not listed.
    pub unkeyed_members: usize,
    /// Registry members that are not replica ids (one error naming how many
    /// and the first), as of the last complete scan.
    pub invalid_members: Option<Error>,
}

/// Every router replica of one key prefix, as this reader last saw them.
pub struct RedisReplicas {
    target: RedisTarget,
    registry: String,
    rescan_interval: Duration,
    con: Option<redis::Connection>,
    members: BTreeMap<Arc<str>, Member>,
    /// Members whose key held a value at the last fetch: fetched every read.
    live: BTreeSet<Arc<str>>,
    /// Members whose key went away after holding a value.
    gone: BTreeSet<Arc<str>>,
    /// Members whose key never held a value when fetched.
    no_key: BTreeSet<Arc<str>>,
    scan: Option<RegistryScan>,
    last_scan_start: Option<Instant>,
    /// Members to fetch once (new, or their key was missing).
    probe: Vec<Arc<str>>,
    /// Members due for `SREM`, and whether this reader may prune.
    pruning: registry::Pruning,
    invalid_members: Option<Error>,
    retry_at: Instant,
    backoff: Backoff,
    connection_error: Option<Error>,
}

impl std::fmt::Debug for RedisReplicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisReplicas")
            .field("target", &self.target)
            .field("connected", &self.con.is_some())
            .field("members", &self.members.len())
            .finish_non_exhaustive()
    }
}

/// A registered replica and what its key held at the last fetch.
struct Member {
    key: String,
    state: MemberState,
    prune_pending: bool,
}

enum MemberState {
    /// Not fetched yet.
    Unfetched,
    /// A value; `heartbeat_at` is this reader's estimate of its heartbeat.
    Value {
        value: RouterValue,
        heartbeat_at: Instant,
    },
    /// The key holds something unusable.
    Fault(Error),
    /// The key is missing since then; `had_value`: it held one before.
    Missing { since: Instant, had_value: bool },
}

impl RedisReplicas {
    /// Connects and reads once (so that bad credentials or an unreachable
    /// server are errors here; later they are [`RedisReplicas::read`]'s),
    /// within one [`RedisTarget::timeout`] (the reader's, 500 ms by default).
    pub fn open(target: RedisTarget) -> Result<RedisReplicas, Error> {
        let target = target.for_reading();
        let now = Instant::now();
        let mut replicas = RedisReplicas {
            registry: router_registry_key(target.prefix()),
            target,
            rescan_interval: DEFAULT_RESCAN_INTERVAL,
            con: None,
            members: BTreeMap::new(),
            live: BTreeSet::new(),
            gone: BTreeSet::new(),
            no_key: BTreeSet::new(),
            scan: None,
            last_scan_start: None,
            probe: Vec::new(),
            pruning: registry::Pruning::new(PRUNE_AFTER),
            invalid_members: None,
            retry_at: now,
            backoff: Backoff::default(),
            connection_error: None,
        };
        let deadline = now + replicas.target.timeout();
        replicas.con = Some(replicas.target.connect_by(deadline)?);
        replicas.fetch(now, deadline)?;
        Ok(replicas)
    }

    /// How often a registry scan starts at most ([`DEFAULT_RESCAN_INTERVAL`]).
    pub fn set_rescan_interval(&mut self, interval: Duration) {
        self.rescan_interval = interval;
    }

    /// How long a registered replica whose key is missing stays registered
    /// ([`PRUNE_AFTER`]; tests shorten it).
    #[doc(hidden)]
    pub fn set_prune_after(&mut self, prune_after: Duration) {
        self.pruning.after = prune_after;
    }

    /// The server, database and prefix read.
    pub fn target(&self) -> &RedisTarget {
        &self.target
    }

    /// Reads every replica (one round trip; two when the registry step
    /// names members to fetch), all within [`RedisTarget::timeout`] of
    /// `now`. A connection failure is an error (the replicas' values are
    /// then unknown); the next read reconnects after a backoff (50 ms
    /// doubling to 5 s), and reads during the backoff return the same error
    /// without waiting.
    pub fn read(&mut self, now: Instant) -> Result<ReplicaReading, Error> {
        let deadline = now + self.target.timeout();
        if self.con.is_none() {
            if now < self.retry_at {
                if let Some(error) = &self.connection_error {
                    return Err(error.clone());
                }
            }
            match self.target.connect_by(deadline) {
                Ok(con) => {
                    self.con = Some(con);
                    // A cursor means nothing to a restarted server.
                    self.scan = None;
                    self.last_scan_start = None;
                }
                Err(error) => return Err(self.failed(error)),
            }
        }
        if let Err(error) = self.fetch(now, deadline) {
            return Err(self.failed(error));
        }
        self.backoff.succeeded();
        self.connection_error = None;
        Ok(self.reading(now))
    }

    fn failed(&mut self, error: Error) -> Error {
        self.con = None;
        self.retry_at = Instant::now() + self.backoff.failed();
        self.connection_error = Some(error.clone());
        error
    }

    /// What the members held at the last fetch, aged to `now`.
    fn reading(&self, now: Instant) -> ReplicaReading {
        let mut reading = ReplicaReading {
            unkeyed_members: self.no_key.len(),
            invalid_members: self.invalid_members.clone(),
            ..ReplicaReading::default()
        };
        for id in &self.live {
            match &self.members[id].state {
                MemberState::Value { value, .. } if value.is_retired() => {
                    reading.gone.push(id.clone());
                }
                MemberState::Value {
                    value,
                    heartbeat_at,
                } => reading.replicas.push((
                    id.clone(),
                    Ok(ReplicaValue {
                        value: value.clone(),
                        heartbeat_age: now.saturating_duration_since(*heartbeat_at),
                    }),
                )),
                MemberState::Fault(error) => {
                    reading.replicas.push((id.clone(), Err(error.clone())))
                }
                MemberState::Unfetched | MemberState::Missing { .. } => {}
            }
        }
        reading.gone.extend(self.gone.iter().cloned());
        reading.gone.sort();
        reading
    }

    fn fetch(&mut self, now: Instant, deadline: Instant) -> Result<(), Error> {
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
        let mut fetched: Vec<Arc<str>> = self.live.iter().cloned().collect();
        let probing = std::mem::take(&mut self.probe);
        fetched.extend(
            probing
                .iter()
                .filter(|id| !self.live.contains(*id))
                .cloned(),
        );
        for id in &fetched {
            pack_fetch(&self.members[id].key, &mut request);
        }
        count += 2 * fetched.len();
        if count == 0 {
            return Ok(());
        }
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
            self.apply_srem(pruning, replies.next())?;
        }
        let step = self
            .scan
            .is_some()
            .then(|| replies.next().unwrap_or(Value::Nil));
        self.apply_values(&fetched, &mut replies, now)?;
        if let Some(step) = step {
            self.apply_step(step)?;
            let probing = std::mem::take(&mut self.probe);
            if !probing.is_empty() {
                let mut request = Vec::new();
                for id in &probing {
                    pack_fetch(&self.members[id].key, &mut request);
                }
                let mut replies = match self.query(&request, 2 * probing.len(), None, deadline) {
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

    fn query(
        &mut self,
        request: &[u8],
        count: usize,
        srem_reply: Option<usize>,
        deadline: Instant,
    ) -> Result<Vec<Value>, Error> {
        let con = self.con.as_mut().expect("connected before fetch");
        let replies = query_by(con, request, count, deadline)
            .map_err(|e| self.target.error("cannot read router replicas", &e))?;
        // The SREM's reply is `apply_srem`'s.
        if let Some(error) = registry::read_error(&replies, srem_reply) {
            return Err(self.target.error("cannot read router replicas", &error));
        }
        Ok(replies)
    }

    /// The `SREM` of `ids`: removed, they leave this reader; a server that
    /// refuses writes (`NOPERM`, `READONLY`) ends pruning (said once).
    fn apply_srem(&mut self, ids: Vec<Arc<str>>, reply: Option<Value>) -> Result<(), Error> {
        let members = &mut self.members;
        let removed = self.pruning.apply_srem(
            ids,
            reply,
            &self.target,
            &self.registry,
            (
                "router replicas",
                "gone",
                "cannot prune the router replica registry",
            ),
            |id| {
                if let Some(member) = members.get_mut(id) {
                    member.prune_pending = false;
                }
            },
        )?;
        for id in &removed {
            self.remove_member(id);
        }
        Ok(())
    }

    fn remove_member(&mut self, id: &Arc<str>) {
        self.members.remove(id);
        self.live.remove(id);
        self.gone.remove(id);
        self.no_key.remove(id);
    }

    /// Applies the `GETRANGE` and `PTTL` replies of `ids` (two each).
    fn apply_values(
        &mut self,
        ids: &[Arc<str>],
        replies: &mut impl Iterator<Item = Value>,
        now: Instant,
    ) -> Result<(), Error> {
        for id in ids {
            let (value, pttl) = registry::next_fetched(replies, &self.target)?;
            let Some(member) = self.members.get_mut(id) else {
                continue; // pruned earlier in this pipeline
            };
            member.apply(value, pttl, now);
            let (live, gone, no_key) = match member.state {
                MemberState::Value { .. } | MemberState::Fault(_) => (true, false, false),
                MemberState::Missing { had_value, .. } => (false, had_value, !had_value),
                MemberState::Unfetched => (false, false, false),
            };
            let missing_since = match member.state {
                MemberState::Missing { since, .. } => Some(since),
                _ => None,
            };
            self.pruning
                .queue_if_due(id, &mut member.prune_pending, missing_since, now);
            for (set, member_of) in [
                (&mut self.live, live),
                (&mut self.gone, gone),
                (&mut self.no_key, no_key),
            ] {
                if member_of {
                    set.insert(id.clone());
                } else {
                    set.remove(id);
                }
            }
        }
        Ok(())
    }

    /// Applies one `SSCAN` reply (new members and those whose key was
    /// missing are probed next; at the scan's end, members it did not see
    /// have left the registry).
    fn apply_step(&mut self, step: Value) -> Result<(), Error> {
        let scan = self
            .scan
            .as_mut()
            .expect("a step is only sent during a scan");
        let done = scan.apply_step(
            step,
            &self.target,
            "cannot read the router replica registry",
            |id| match self.members.get(&id) {
                Some(known) if known.prune_pending => {} // its SREM is on the way
                Some(_) if self.live.contains(&id) => {}
                Some(_) => self.probe.push(id),
                None => {
                    self.members.insert(
                        id.clone(),
                        Member {
                            key: router_key(self.target.prefix(), &id),
                            state: MemberState::Unfetched,
                            prune_pending: false,
                        },
                    );
                    self.probe.push(id);
                }
            },
        )?;
        if done {
            let scan = self.scan.take().expect("scanning");
            let (left, invalid) =
                scan.finish(self.members.keys(), &self.registry, "router replica ids");
            for id in &left {
                self.remove_member(id);
            }
            self.invalid_members = invalid;
        }
        Ok(())
    }
}

/// `GETRANGE` (one byte more than the largest value) and `PTTL` of `key`.
fn pack_fetch(key: &str, out: &mut Vec<u8>) {
    registry::pack_fetch(key, MAX_ROUTER_VALUE_SIZE, out);
}

impl Member {
    /// Applies one `GETRANGE` reply and the key's `PTTL` (-2: no such key).
    fn apply(&mut self, value: Value, pttl: i64, now: Instant) {
        if pttl == -2 {
            let had_value = match self.state {
                MemberState::Value { .. } => true,
                MemberState::Missing { had_value, .. } => had_value,
                MemberState::Unfetched | MemberState::Fault(_) => false,
            };
            if !matches!(self.state, MemberState::Missing { .. }) {
                self.state = MemberState::Missing {
                    since: now,
                    had_value,
                };
            }
            return;
        }
        let decoded = registry::fetched_bytes(&self.key, value)
            .and_then(|bytes| decode_fetched_router(&self.key, &bytes, pttl));
        self.state = match decoded {
            Err(error) => MemberState::Fault(error),
            Ok(value) => {
                let heartbeat_at = match &self.state {
                    MemberState::Value {
                        value: last,
                        heartbeat_at,
                    } if (last.generation, last.heartbeat_seq)
                        == (value.generation, value.heartbeat_seq) =>
                    {
                        *heartbeat_at
                    }
                    _ => {
                        let age = router_heartbeat_age_at_fetch(&value, pttl);
                        now.checked_sub(age).unwrap_or(now)
                    }
                };
                MemberState::Value {
                    value,
                    heartbeat_at,
                }
            }
        };
    }
}
