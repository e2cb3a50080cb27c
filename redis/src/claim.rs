//! Claiming an engine's key: a publisher's first write, refused while
//! another live writer holds the id ([`SET_IF_OWNER_SCRIPT`], docs/REDIS.md).
//!
//! The script is sent by its SHA-1 (`EVALSHA`, 40 bytes instead of the
//! script's ~450); a server that does not have it cached (restarted,
//! `SCRIPT FLUSH`, a new replica) answers `NOSCRIPT`, and the claim is sent
//! again with `EVAL`, which caches it for the next one. So is a claim that
//! `EVALSHA` cannot run for any other reason the server gives: an ACL that
//! grants `+eval` alone (REDIS.md's advice; `EVALSHA` is a command of its
//! own to an ACL), a proxy that lacks `EVALSHA`. Only `EVAL`'s answer is
//! reported, so what a user must grant is what it was before.

use crate::error::Error;
use crate::replies::holder_pid;
use crate::schema::{engine_key, RedisRecord, SET_IF_OWNER_SCRIPT, SET_IF_OWNER_SCRIPT_SHA1};
use crate::target::RedisTarget;

/// What [`claim`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The record was written: the id is this writer's.
    Written,
    /// Another live writer holds the id; nothing was written.
    Held {
        /// The holder's pid on its host (from its record).
        holder_pid: u32,
        /// The engine's key.
        key: String,
    },
}

/// Writes `record` as `engine_id`'s first record, with the target's TTL,
/// unless another live writer holds the engine's key (one round trip, two
/// when `EVALSHA` is refused; each bounded by the connection's timeout).
pub fn claim(
    con: &mut redis::Connection,
    target: &RedisTarget,
    engine_id: &str,
    mut record: RedisRecord,
) -> Result<Claim, Error> {
    let key = engine_key(target.prefix(), engine_id);
    let ttl_ms = target.ttl().as_millis() as u32;
    record.ttl_ms = ttl_ms;
    let value = record.encode();
    let run = |con: &mut redis::Connection, command: &str, script: &str| {
        redis::cmd(command)
            .arg(script)
            .arg(1)
            .arg(&key)
            .arg(&value[..])
            .arg(ttl_ms)
            .query::<redis::Value>(con)
    };
    let reply = match run(con, "EVALSHA", SET_IF_OWNER_SCRIPT_SHA1) {
        // A server's refusal (NOSCRIPT, NOPERM, an unknown command), not a
        // lost connection or a timeout: those are errors as they are.
        Err(e) if e.code().is_some() => run(con, "EVAL", SET_IF_OWNER_SCRIPT),
        reply => reply,
    }
    .map_err(|e| target.error("cannot claim the engine's key", &e))?;
    Ok(match reply {
        redis::Value::BulkString(header) => Claim::Held {
            holder_pid: holder_pid(&header),
            key,
        },
        _ => Claim::Written,
    })
}
