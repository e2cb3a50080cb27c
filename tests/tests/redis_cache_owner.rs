//! Two writers of one engine id and its cache digest key, against a real
//! `redis-server` (docs/FORMAT.md, "On Redis"; docs/REDIS.md, "The cache
//! digest key"): the digest's expiry is refreshed under the engine record's
//! owner check, like the record itself. A writer whose record is refused
//! (another live writer holds the id) neither keeps the holder's digest
//! alive nor writes its own over it; once the id is its own again it writes
//! its digest again, since the key may hold the other writer's or nothing.
//! Run for both owner-checked sinks: a publisher's `RedisSink` (every write
//! through the script) and the relay's `InlineSink::owner_checked` (a held
//! key written with plain commands).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use engine_state_redis::{
    cache_key, engine_key, InlineSink, RecordWriter, RedisRecord, RedisSink, RedisTarget,
    RelayWrite, SinkOp, SET_IF_OWNER_SCRIPT,
};
use engine_state_shm_format::{
    decode_digest_value, encode_digest_value, monotonic_ns, CacheDigest, DigestRecord, Snapshot,
};
use engine_state_tests::*;

/// The records' and digests' `ttl_ms`: every key of the test expires on
/// the server's clock within it; the short network timeout gives the
/// relay's sink a hold (`ttl_ms − timeout_ms) / 2`) shorter than the ttl,
/// so a writer that kept silent until its key expired claims it again with
/// the owner check.
const QUERY: &str = "?prefix=co:&ttl_ms=2000&timeout_ms=200";
const TTL_MS: i64 = 2000;

/// One owner-checked writer of the engine id.
enum Writer {
    Publisher(RedisSink),
    Relay(Box<InlineSink>),
}

/// One run of the engine: its writer's identity and its digest.
struct Run {
    writer: RecordWriter,
    blocks: Vec<u64>,
    seq: u64,
}

impl Run {
    fn new(pid: u32, generation: u64, blocks: &[u64]) -> Run {
        Run {
            writer: RecordWriter {
                pid,
                publish_period_us: 20_000,
                generation,
            },
            blocks: blocks.to_vec(),
            seq: 0,
        }
    }

    fn digest(&self) -> Arc<[u8]> {
        encode_digest_value(&DigestRecord {
            writer_pid: self.writer.pid,
            generation: self.writer.generation,
            digest: CacheDigest::new(1, monotonic_ns(), self.blocks.clone()),
            held: self.blocks.len() as u64,
            ..DigestRecord::default()
        })
        .unwrap()
        .into()
    }

    /// The next heartbeat record, naming digest version 1.
    fn record(&mut self) -> RedisRecord {
        self.seq += 1;
        let snapshot = Snapshot {
            captured_mono_ns: monotonic_ns(),
            cache_blocks: self.blocks.len() as u64,
            cache_version: 1,
            ..Snapshot::default()
        };
        RedisRecord::active(self.writer, self.seq, monotonic_ns(), snapshot)
    }
}

impl Writer {
    fn start(relay: bool, server: &RedisServer, owner: &mut Run) -> Writer {
        let target = RedisTarget::parse(&server.uri(QUERY)).unwrap();
        let con = target.connect().unwrap();
        if relay {
            Writer::Relay(Box::new(
                InlineSink::new(target, Some(con), None).owner_checked(),
            ))
        } else {
            let owner = owner.record();
            Writer::Publisher(RedisSink::start(target, Some(con), None, "co", Some(owner)).unwrap())
        }
    }

    /// Writes `run`'s next record (after its digest, when `digest`) and
    /// waits for the replies.
    fn write(&mut self, id: &Arc<str>, run: &mut Run, digest: bool) {
        let record = run.record();
        let flushed = match self {
            Writer::Publisher(sink) => {
                if digest {
                    sink.send_cache(id, run.digest());
                }
                sink.send(id, SinkOp::Set(record));
                sink.flush(Duration::from_secs(10))
            }
            Writer::Relay(sink) => {
                let mut writes = Vec::new();
                if digest {
                    writes.push((id.clone(), RelayWrite::Digest(run.digest())));
                }
                writes.push((id.clone(), RelayWrite::Op(SinkOp::Set(record))));
                sink.submit(&mut writes);
                sink.flush(Duration::from_secs(10))
            }
        };
        assert!(flushed, "the write acknowledged");
    }

    fn refused(&self) -> u64 {
        let stats = match self {
            Writer::Publisher(sink) => sink.stats(),
            Writer::Relay(sink) => sink.stats(),
        };
        stats.refused.load(Ordering::Relaxed)
    }
}

fn pttl(con: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(con).unwrap()
}

/// The (`writer_pid`, `generation`) of the digest at `key`, if any.
fn digest_owner(con: &mut redis::Connection, key: &str) -> Option<(u32, u64)> {
    get(con, key).map(|value| {
        let value = decode_digest_value(&value).unwrap();
        (value.writer_pid, value.generation)
    })
}

fn record_owner(con: &mut redis::Connection, key: &str) -> Option<(u32, u64)> {
    get(con, key).map(|value| {
        let record = RedisRecord::decode(key, &value).unwrap();
        (record.writer_pid, record.generation)
    })
}

fn two_writers_of_one_id(relay: bool) {
    let server = RedisServer::start();
    let mut con = server.connection();
    let id: Arc<str> = if relay { "relayed" } else { "published" }.into();
    let (record_key, digest_key) = (engine_key("co:", &id), cache_key("co:", &id));
    let mut old = Run::new(101, 1, &[1, 2, 3]);
    let mut new = Run::new(202, 2, &[4, 5]);
    let mut first = Writer::start(relay, &server, &mut old);
    first.write(&id, &mut old, true);
    assert_eq!(digest_owner(&mut con, &digest_key), Some((101, 1)));

    // The first writer hangs: its keys expire, and a second run takes the
    // id over with its own digest.
    wait_for_within(
        Duration::from_secs(30),
        || get(&mut con, &record_key).is_none() && get(&mut con, &digest_key).is_none(),
        "the first writer's keys expired",
    );
    let mut second = Writer::start(relay, &server, &mut new);
    second.write(&id, &mut new, true);
    assert_eq!(record_owner(&mut con, &record_key), Some((202, 2)));
    assert_eq!(digest_owner(&mut con, &digest_key), Some((202, 2)));

    // The first writer wakes up: its record is refused, and so is the
    // digest's refresh: the second writer's digest keeps the expiry it had
    // (given by hand here, longer than any writer's).
    let _: () = redis::cmd("PEXPIRE")
        .arg(&digest_key)
        .arg(600_000)
        .query(&mut con)
        .unwrap();
    let refused = first.refused();
    first.write(&id, &mut old, false);
    assert!(first.refused() > refused, "the displaced record refused");
    assert_eq!(record_owner(&mut con, &record_key), Some((202, 2)));
    let ttl = pttl(&mut con, &digest_key);
    assert!(
        ttl > TTL_MS,
        "the displaced writer refreshed the new owner's digest (PTTL {ttl} ms)"
    );
    // The owner's next record refreshes it.
    second.write(&id, &mut new, false);
    let ttl = pttl(&mut con, &digest_key);
    assert!((1..=TTL_MS).contains(&ttl), "the owner's refresh: {ttl}");

    // Redis loses the digest: the displaced writer does not write its own
    // in its place; the owner writes its own again.
    let _: () = redis::cmd("DEL").arg(&digest_key).query(&mut con).unwrap();
    for _ in 0..3 {
        first.write(&id, &mut old, false);
    }
    assert_eq!(digest_owner(&mut con, &digest_key), None);
    wait_for(
        || {
            second.write(&id, &mut new, false);
            digest_owner(&mut con, &digest_key) == Some((202, 2))
        },
        "the owner's digest written again",
    );

    // The second writer stops (a crash: nothing deleted) while the first
    // keeps writing: its refused records keep neither of the second's keys
    // alive; once they expired it takes the id back, and writes its own
    // digest again (the key held the other run's, then nothing).
    wait_for_within(
        Duration::from_secs(30),
        || {
            first.write(&id, &mut old, false);
            record_owner(&mut con, &record_key) == Some((101, 1))
                && digest_owner(&mut con, &digest_key) == Some((101, 1))
        },
        "the first writer's record and digest back",
    );
    let mut source = digest_reader(&server.uri(QUERY));
    let mut reading = engine_state_reader::Reading::default();
    wait_for(
        || {
            first.write(&id, &mut old, false);
            source.read_into(&mut reading).unwrap();
            reading.get(&id).is_some_and(|e| e.cache.is_some())
        },
        "a reader reads the first writer's digest",
    );
    let state = reading.get(&id).unwrap();
    assert_eq!(state.generation, 1);
    assert_eq!(state.cache.as_ref().unwrap().blocks(), &[1, 2, 3]);
}

#[test]
fn a_displaced_publisher_neither_refreshes_nor_rewrites_the_owners_digest() {
    two_writers_of_one_id(false);
}

#[test]
fn a_displaced_relay_neither_refreshes_nor_rewrites_the_owners_digest() {
    two_writers_of_one_id(true);
}

/// The record's owner check with the digest key as its second key: a
/// written record refreshes the digest's expiry and replies `PEXPIRE`'s
/// answer (0: no digest key); a refused one touches neither key.
#[test]
fn the_record_script_refreshes_the_digest_only_when_it_writes_the_record() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let (record_key, digest_key) = (engine_key("s:", "e"), cache_key("s:", "e"));
    let run = |con: &mut redis::Connection, run: &mut Run| -> redis::Value {
        redis::cmd("EVAL")
            .arg(SET_IF_OWNER_SCRIPT)
            .arg(2)
            .arg(&record_key)
            .arg(&digest_key)
            .arg(&run.record().encode()[..])
            .arg(TTL_MS)
            .query(con)
            .unwrap()
    };
    let (mut ours, mut theirs) = (Run::new(7, 1, &[1]), Run::new(8, 1, &[2]));
    // Written, no digest key yet: 0.
    assert_eq!(run(&mut con, &mut ours), redis::Value::Int(0));
    assert_eq!(pttl(&mut con, &digest_key), -2, "no key made by PEXPIRE");
    let _: () = redis::cmd("SET")
        .arg(&digest_key)
        .arg(&ours.digest()[..])
        .arg("PX")
        .arg(600_000)
        .query(&mut con)
        .unwrap();
    // Refused: the holder's header; the digest keeps its expiry.
    let reply = run(&mut con, &mut theirs);
    assert!(
        matches!(&reply, redis::Value::BulkString(h) if h.len() == 64 && h[..8] == *b"ENGSTATE"),
        "{reply:?}"
    );
    assert!(pttl(&mut con, &digest_key) > TTL_MS);
    assert_eq!(record_owner(&mut con, &record_key), Some((7, 1)));
    // Written: 1, the digest's expiry is the record's.
    assert_eq!(run(&mut con, &mut ours), redis::Value::Int(1));
    let ttl = pttl(&mut con, &digest_key);
    assert!((1..=TTL_MS).contains(&ttl), "{ttl}");
}
