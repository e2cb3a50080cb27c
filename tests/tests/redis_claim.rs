//! A publisher's claim of its engine's key (`engine_state_redis::claim`)
//! against a real redis-server: the script goes by its SHA-1 (`EVALSHA`),
//! and a server without it cached (`SCRIPT FLUSH`, a restart) gets it again
//! by `EVAL` instead of failing the claim.

use engine_state_redis::{
    claim, engine_key, Claim, RecordWriter, RedisRecord, RedisTarget, SET_IF_OWNER_SCRIPT,
    SET_IF_OWNER_SCRIPT_SHA1,
};
use engine_state_shm_format::Snapshot;
use engine_state_tests::*;

fn record(pid: u32, generation: u64) -> RedisRecord {
    let writer = RecordWriter {
        pid,
        publish_period_us: 50_000,
        generation,
    };
    RedisRecord::active(writer, 1, 1, Snapshot::default())
}

fn script_cached(con: &mut redis::Connection) -> bool {
    let cached: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(SET_IF_OWNER_SCRIPT_SHA1)
        .query(con)
        .unwrap();
    cached == [true]
}

#[test]
fn the_sha1_is_the_scripts() {
    let server = RedisServer::start();
    let loaded: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(SET_IF_OWNER_SCRIPT)
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(loaded, SET_IF_OWNER_SCRIPT_SHA1);
}

#[test]
fn a_claim_survives_a_flushed_script_cache_and_still_checks_the_owner() {
    let server = RedisServer::start();
    let target = RedisTarget::parse(&server.uri("?prefix=claim:")).unwrap();
    let mut con = target.connect().unwrap();
    let mut plain = server.connection();
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query::<()>(&mut plain)
        .unwrap();
    assert!(!script_cached(&mut plain));

    // NOSCRIPT, then EVAL: written, and the server has the script now.
    assert_eq!(
        claim(&mut con, &target, "e0", record(10, 1)).unwrap(),
        Claim::Written
    );
    assert!(script_cached(&mut plain));
    let key = engine_key("claim:", "e0");
    let value: Vec<u8> = redis::cmd("GET").arg(&key).query(&mut plain).unwrap();
    assert_eq!(value[..], record_with_ttl(&target, record(10, 1))[..]);

    // Flushed again: another writer's claim is refused (the script ran).
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query::<()>(&mut plain)
        .unwrap();
    assert_eq!(
        claim(&mut con, &target, "e0", record(11, 2)).unwrap(),
        Claim::Held {
            holder_pid: 10,
            key: key.clone()
        }
    );
    // Cached now: by EVALSHA alone, the same answer; the holder's own next
    // run (same pid and generation) is let through.
    assert!(script_cached(&mut plain));
    assert!(matches!(
        claim(&mut con, &target, "e0", record(11, 2)).unwrap(),
        Claim::Held { holder_pid: 10, .. }
    ));
    assert_eq!(
        claim(&mut con, &target, "e0", record(10, 1)).unwrap(),
        Claim::Written
    );
}

/// `record` as `claim` writes it: with the target's TTL.
fn record_with_ttl(target: &RedisTarget, mut record: RedisRecord) -> Vec<u8> {
    record.ttl_ms = target.ttl().as_millis() as u32;
    record.encode().to_vec()
}

/// `(calls, failed_calls + rejected_calls)` of `command` in `INFO commandstats`.
fn command_stats(con: &mut redis::Connection, command: &str) -> (u64, u64) {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con).unwrap();
    let prefix = format!("cmdstat_{command}:");
    let Some(line) = info.lines().find(|l| l.starts_with(&prefix)) else {
        return (0, 0);
    };
    let field = |name: &str| -> u64 {
        line[prefix.len()..]
            .split(',')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .map_or(0, |v| v.parse().unwrap())
    };
    (
        field("calls"),
        field("failed_calls") + field("rejected_calls"),
    )
}

/// With the script cached, a claim is one `EVALSHA` and no `EVAL`.
#[test]
fn a_cached_script_is_sent_by_its_sha1_alone() {
    let server = RedisServer::start();
    let target = RedisTarget::parse(&server.uri("?prefix=sha:")).unwrap();
    let mut con = target.connect().unwrap();
    let mut plain = server.connection();
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(SET_IF_OWNER_SCRIPT)
        .query::<String>(&mut plain)
        .unwrap();
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query::<()>(&mut plain)
        .unwrap();
    assert_eq!(
        claim(&mut con, &target, "e0", record(10, 1)).unwrap(),
        Claim::Written
    );
    assert_eq!(command_stats(&mut plain, "evalsha"), (1, 0));
    assert_eq!(command_stats(&mut plain, "eval").0, 0);
}

/// The ACL REDIS.md advises for publishers (`+ping +@read +@write +eval`) does not
/// grant `EVALSHA`: the claim still goes through, by `EVAL`.
#[test]
fn a_user_granted_eval_alone_can_claim() {
    let server = RedisServer::start();
    redis::cmd("ACL")
        .arg(
            &[
                "SETUSER", "pub", "on", ">pw", "~*", "+ping", "+@read", "+@write", "+eval",
            ][..],
        )
        .query::<()>(&mut server.connection())
        .unwrap();
    let uri = format!("redis://pub:pw@127.0.0.1:{}/0?prefix=acl:", server.port());
    let target = RedisTarget::parse(&uri).unwrap();
    let mut con = target.connect().unwrap();
    let mut plain = server.connection();
    // Cached or not, EVALSHA is refused to this user (NOPERM).
    for flush in [true, false] {
        if flush {
            redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query::<()>(&mut plain)
                .unwrap();
        }
        assert_eq!(
            claim(&mut con, &target, "e0", record(10, 1)).unwrap(),
            Claim::Written,
            "flushed: {flush}"
        );
    }
    assert!(matches!(
        claim(&mut con, &target, "e0", record(11, 2)).unwrap(),
        Claim::Held { holder_pid: 10, .. }
    ));
}

/// A refused script (here: an ACL without `EVAL`/`EVALSHA`) is an error
/// that says which permission to grant, not a claim.
#[test]
fn a_refused_script_is_an_error_not_a_claim() {
    let server = RedisServer::start();
    redis::cmd("ACL")
        .arg(
            &[
                "SETUSER", "noscript", "on", ">pw", "~*", "+@all", "-eval", "-evalsha",
            ][..],
        )
        .query::<()>(&mut server.connection())
        .unwrap();
    let uri = format!("redis://noscript:pw@127.0.0.1:{}/0", server.port());
    let target = RedisTarget::parse(&uri).unwrap();
    let mut con = target.connect().unwrap();
    let error = claim(&mut con, &target, "e0", record(10, 1))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("NOPERM") || error.contains("NoPerm"),
        "{error}"
    );
    assert!(error.contains("EVAL for publishers"), "{error}");
}
