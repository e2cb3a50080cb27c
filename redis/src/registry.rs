//! Reading a registry set, shared by the engines' reader
//! ([`crate::RedisSource`], `<prefix>engines`) and the router replicas'
//! ([`crate::RedisReplicas`], `<prefix>routers`) (docs/REDIS.md, "A
//! registry flood"): one `SSCAN … COUNT` [`SCAN_STEP`] per read while a scan
//! runs, members that are not ids counted once and skipped, ids whose key is
//! gone pruned by one `SREM` of at most [`SCAN_STEP`] ids sent before the
//! step, and each member's key fetched with `GETRANGE` and `PTTL`. What a
//! member is, and what its key holds, is each reader's own.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine_state_shm_format::EngineId;
use redis::Value;

use crate::error::Error;
use crate::source::SCAN_STEP;
use crate::target::RedisTarget;

/// One pass over a registry, a [`SCAN_STEP`] at a time.
#[derive(Default)]
pub(crate) struct RegistryScan {
    /// The `SSCAN` cursor (0: start, or done once a step returned it).
    pub(crate) cursor: u64,
    /// Valid members seen so far: who is not seen by the end left.
    seen: HashSet<Arc<str>>,
    /// Members that are not ids seen so far (`SSCAN` may return a member
    /// twice: each is counted once).
    seen_invalid: HashSet<Vec<u8>>,
    /// Members that are not ids (or not UTF-8): how many, and the first.
    invalid: usize,
    first_invalid: Option<(String, String)>,
}

impl RegistryScan {
    /// Applies one `SSCAN` reply: `found` is called once per valid member
    /// the scan had not seen yet, in the reply's order. Returns whether the
    /// scan is done (its cursor is back at 0; then [`RegistryScan::finish`]).
    /// A server error (`WRONGTYPE`: the registry holds something else) is
    /// `unreadable` ("cannot read the … registry"); a reply that is not an
    /// `SSCAN` reply is a protocol error.
    pub(crate) fn apply_step(
        &mut self,
        step: Value,
        target: &RedisTarget,
        unreadable: &'static str,
        mut found: impl FnMut(Arc<str>),
    ) -> Result<bool, Error> {
        if let Value::ServerError(e) = step {
            let error: redis::RedisError = e.into();
            return Err(target.error(unreadable, &error));
        }
        let Value::Array(parts) = &step else {
            return Err(protocol_error(target, &Some(step)));
        };
        let (Some(cursor), Some(Value::Array(members) | Value::Set(members))) =
            (parts.first().and_then(text), parts.get(1))
        else {
            return Err(protocol_error(target, &Some(step.clone())));
        };
        let Ok(cursor) = cursor.parse::<u64>() else {
            return Err(protocol_error(target, &Some(step.clone())));
        };
        for member in members {
            let bytes: &[u8] = match member {
                Value::BulkString(bytes) => bytes,
                Value::SimpleString(s) => s.as_bytes(),
                other => return Err(protocol_error(target, &Some(other.clone()))),
            };
            let valid = match std::str::from_utf8(bytes) {
                Ok(member) => EngineId::new(member)
                    .map(|_| member)
                    .map_err(|e| e.to_string()),
                Err(_) => Err("not UTF-8".to_owned()),
            };
            let member = match valid {
                Ok(member) => member,
                Err(why) => {
                    // SSCAN may return a member twice: counted once.
                    if self.seen_invalid.insert(bytes.to_vec()) {
                        self.invalid += 1;
                        self.first_invalid.get_or_insert_with(|| {
                            (String::from_utf8_lossy(bytes).into_owned(), why)
                        });
                    }
                    continue;
                }
            };
            if self.seen.contains(member) {
                continue; // SSCAN may return a member twice
            }
            let id: Arc<str> = Arc::from(member);
            self.seen.insert(id.clone());
            found(id);
        }
        self.cursor = cursor;
        Ok(cursor == 0)
    }

    /// The end of a complete scan (once per scan, not per read): the ids of
    /// `known` it did not see (they left the registry), and one error
    /// naming how many members of `registry` are not `ids` ("engine ids")
    /// and the first.
    pub(crate) fn finish<'a>(
        self,
        known: impl Iterator<Item = &'a Arc<str>>,
        registry: &str,
        ids: &str,
    ) -> (Vec<Arc<str>>, Option<Error>) {
        let left = known
            .filter(|id| !self.seen.contains(*id))
            .cloned()
            .collect();
        let invalid = self.first_invalid.map(|(member, why)| Error::ForeignValue {
            key: registry.to_owned(),
            what: format!(
                "{} member(s) are not {ids} and are skipped, e.g. {member:?}: {why}; \
                 remove them with SREM",
                self.invalid
            ),
        });
        (left, invalid)
    }
}

/// Packs the registry's share of a read into `out`: first the `SREM` of the
/// last [`SCAN_STEP`] ids of `prune` (taken from it and returned: a scan
/// step after it cannot name, and re-add, an id it removes), then the
/// scan's step. Returns those ids and how many commands were packed.
pub(crate) fn pack_registry(
    registry: &str,
    prune: &mut Vec<Arc<str>>,
    scan: Option<&RegistryScan>,
    out: &mut Vec<u8>,
) -> (Vec<Arc<str>>, usize) {
    let mut count = 0;
    let from = prune.len().saturating_sub(SCAN_STEP);
    let pruning: Vec<Arc<str>> = prune.drain(from..).collect();
    if !pruning.is_empty() {
        let mut srem = redis::cmd("SREM");
        srem.arg(registry);
        for id in &pruning {
            srem.arg(&**id);
        }
        srem.write_packed_command(out);
        count += 1;
    }
    if let Some(scan) = scan {
        redis::cmd("SSCAN")
            .arg(registry)
            .arg(scan.cursor)
            .arg("COUNT")
            .arg(SCAN_STEP)
            .write_packed_command(out);
        count += 1;
    }
    (pruning, count)
}

/// `GETRANGE key 0 end` (one byte more than the largest value tells "too
/// large" from "a value") and `PTTL key`.
pub(crate) fn pack_fetch(key: &str, end: usize, out: &mut Vec<u8>) {
    redis::cmd("GETRANGE")
        .arg(key)
        .arg(0)
        .arg(end)
        .write_packed_command(out);
    redis::cmd("PTTL").arg(key).write_packed_command(out);
}

/// The error that fails a whole read, if any: a server error other than
/// `WRONGTYPE` (that concerns one member's key, judged per member, or the
/// registry, reported by [`RegistryScan::apply_step`]) in any reply but the
/// `SREM`'s (`srem_reply`: a reader that may not write still reads).
pub(crate) fn read_error(
    replies: &[Value],
    srem_reply: Option<usize>,
) -> Option<redis::RedisError> {
    replies.iter().enumerate().find_map(|(i, v)| match v {
        Value::ServerError(e) if Some(i) != srem_reply && e.code() != "WRONGTYPE" => {
            Some(e.clone().into())
        }
        _ => None,
    })
}

/// Judges the `SREM`'s reply: `Ok(None)`, the ids are removed; `Ok(Some)`,
/// the server refuses writes (`NOPERM`: a read-only ACL user; `READONLY`: a
/// replica), pruning ends; `Err`, any other failure (`unprunable`: "cannot
/// prune the … registry"), the ids are pruned again next read.
fn srem_reply(
    reply: Option<Value>,
    target: &RedisTarget,
    unprunable: &'static str,
) -> Result<Option<redis::RedisError>, Error> {
    match reply {
        Some(Value::Int(_)) => Ok(None),
        Some(Value::ServerError(e)) if matches!(e.code(), "NOPERM" | "READONLY") => {
            Ok(Some(e.into()))
        }
        Some(Value::ServerError(e)) => {
            let error: redis::RedisError = e.into();
            Err(target.error(unprunable, &error))
        }
        other => Err(protocol_error(target, &other)),
    }
}

/// The next `GETRANGE` and `PTTL` replies of one member's key (`ms` from
/// `PTTL`: -2 no such key, -1 no expiry).
pub(crate) fn next_fetched(
    replies: &mut impl Iterator<Item = Value>,
    target: &RedisTarget,
) -> Result<(Value, i64), Error> {
    let value = replies.next();
    let pttl = match replies.next() {
        Some(Value::Int(ms)) => ms,
        other => return Err(protocol_error(target, &other)),
    };
    let Some(value) = value else {
        return Err(protocol_error(target, &None));
    };
    Ok((value, pttl))
}

/// A reply that is not what the command sent replies.
pub(crate) fn protocol_error(target: &RedisTarget, got: &Option<Value>) -> Error {
    Error::Redis {
        uri: target.to_string(),
        error: format!("unexpected reply {got:?}"),
        hint: "check that the URI names a Redis server (not another service)",
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

/// The bytes a member's `GETRANGE` read (a string key; a missing one reads
/// as ""), or why its key holds no value of this reader's.
pub(crate) fn fetched_bytes(key: &str, value: Value) -> Result<Vec<u8>, Error> {
    match value {
        Value::BulkString(bytes) => Ok(bytes),
        Value::ServerError(e) if e.code() == "WRONGTYPE" => Err(Error::ForeignValue {
            key: key.to_owned(),
            what: "the key holds a list, hash, set or other non-string type".to_owned(),
        }),
        other => Err(Error::ForeignValue {
            key: key.to_owned(),
            what: format!("unexpected reply {other:?}"),
        }),
    }
}

/// The ids due for `SREM`, and whether this reader may prune at all.
pub(crate) struct Pruning {
    /// Ids due for `SREM` (each marked `prune_pending` by its reader); an
    /// id leaves its reader only once its `SREM` succeeded.
    pub(crate) due: Vec<Arc<str>>,
    /// The server refused `SREM` (`NOPERM`: a read-only ACL user;
    /// `READONLY`: a replica): this reader no longer prunes, and ids whose
    /// keys are gone stay listed (said once, as a warning).
    pub(crate) refused: bool,
    /// How long an id's key is missing before it is pruned
    /// ([`crate::PRUNE_AFTER`]; shorter in tests).
    pub(crate) after: Duration,
}

impl Pruning {
    pub(crate) fn new(after: Duration) -> Pruning {
        Pruning {
            due: Vec::new(),
            refused: false,
            after,
        }
    }

    /// Queues `id` for `SREM` when its key has been missing since
    /// `missing_since` for [`Pruning::after`] and it is not queued yet
    /// (`pending`, its reader's mark, is then set).
    pub(crate) fn queue_if_due(
        &mut self,
        id: &Arc<str>,
        pending: &mut bool,
        missing_since: Option<Instant>,
        now: Instant,
    ) {
        if !self.refused
            && !*pending
            && missing_since.is_some_and(|t| now.duration_since(t) >= self.after)
        {
            *pending = true;
            self.due.push(id.clone());
        }
    }

    /// Applies the `SREM` of `ids` (`reply`): returns the ids removed from
    /// the registry (they leave the reader too). A server that refuses
    /// writes (`NOPERM`, `READONLY`) ends pruning, said once (`members` and
    /// `listed_as`: "engines" stay listed as "dead"; `unmark` clears the
    /// `prune_pending` of `ids` and of every id queued); any other failure
    /// (`unprunable`: "cannot prune the … registry") queues them again.
    pub(crate) fn apply_srem(
        &mut self,
        ids: Vec<Arc<str>>,
        reply: Option<Value>,
        target: &RedisTarget,
        registry: &str,
        (members, listed_as, unprunable): (&str, &str, &'static str),
        unmark: impl FnMut(&Arc<str>),
    ) -> Result<Vec<Arc<str>>, Error> {
        match srem_reply(reply, target, unprunable) {
            Ok(None) => Ok(ids),
            Ok(Some(error)) => {
                self.stop(target, registry, (members, listed_as), error, &ids, unmark);
                Ok(Vec::new())
            }
            Err(error) => {
                self.due.extend(ids);
                Err(error)
            }
        }
    }

    fn stop(
        &mut self,
        target: &RedisTarget,
        registry: &str,
        (members, listed_as): (&str, &str),
        error: redis::RedisError,
        ids: &[Arc<str>],
        mut unmark: impl FnMut(&Arc<str>),
    ) {
        crate::log::warn(format_args!(
            "{target}: this reader may not remove {members} whose keys are gone from the \
             registry {registry} ({error}); they stay listed as {listed_as}. Grant the user \
             SREM on it, or read from the primary, to have them pruned"
        ));
        self.refused = true;
        for id in ids.iter().chain(&self.due) {
            unmark(id);
        }
        self.due.clear();
    }
}
