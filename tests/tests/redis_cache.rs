//! Cache digests through Redis (docs/REDIS.md, "Key schema"; the value:
//! docs/FORMAT.md, "Cache residency"), against a real `redis-server`: the
//! publisher writes `<prefix>cache:<id>` on change (owner-checked), its
//! expiry refreshed with every record and the key deleted on a clean close;
//! a reader with digests fetches a value only when the record's
//! `cache_version` moved, and what is not a digest is that engine's error.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine_state_reader::{Error, Reading, Source};
use engine_state_redis::{
    cache_key, engine_key, RecordWriter, RedisRecord, DELETE_CACHE_IF_OWNER_SCRIPT,
    SET_CACHE_IF_OWNER_SCRIPT,
};
use engine_state_shm_format::{
    decode_digest_value, encode_digest_value, CacheDigest, DigestRecord, Snapshot,
};
use engine_state_tests::*;

fn pttl(con: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(con).unwrap()
}

/// Calls of `command` the server has run (`INFO commandstats`).
fn calls(con: &mut redis::Connection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con).unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Reads until `engine`'s snapshot names digest `version`.
fn read_until(source: &mut dyn Source, engine: &str, version: u64) -> Reading {
    let mut reading = Reading::default();
    wait_for(
        || {
            source.read_into(&mut reading).unwrap();
            reading
                .get(engine)
                .is_some_and(|e| e.snapshot.cache_version == version)
        },
        "the record naming the digest",
    );
    reading
}

fn cache_errors(reading: &Reading) -> Vec<String> {
    reading
        .errors
        .iter()
        .filter(|e| e.error.is_cache_fault())
        .map(|e| e.to_string())
        .collect()
}

#[test]
fn a_publishers_digest_is_written_on_change_kept_alive_and_deleted_on_close() {
    let server = RedisServer::start();
    let uri = server.uri("?prefix=rc:");
    let mut con = server.connection();
    let mut publisher = start_publisher(&uri, "e0", 20).unwrap();
    let key = cache_key("rc:", "e0");
    assert!(publisher.publish_cache(&[30, 10, 20], 3, 8).unwrap());
    publisher.publish(Snapshot::default()).unwrap();
    let mut source = digest_reader(&uri);
    let reading = read_until(&mut *source, "e0", 1);
    let state = reading.get("e0").unwrap();
    let digest = state.cache.clone().expect("the digest read");
    assert_eq!((digest.version(), digest.blocks()), (1, &[10, 20, 30][..]));
    assert_eq!(state.snapshot.cache_blocks, 3);

    // The value: the record's writer and generation, capacity = count.
    let value = decode_digest_value(&get(&mut con, &key).unwrap()).unwrap();
    let record =
        RedisRecord::decode("k", &get(&mut con, &engine_key("rc:", "e0")).unwrap()).unwrap();
    assert_eq!(
        (value.writer_pid, value.generation),
        (record.writer_pid, record.generation)
    );
    assert_eq!(value.digest.blocks(), &[10, 20, 30]);
    let ttl = pttl(&mut con, &key);
    assert!((1..=2000).contains(&ttl), "PX ttl_ms: {ttl}");

    // Nothing moved: reads fetch the record alone (one GETRANGE each), the
    // same Arc handed out.
    let before = calls(&mut con, "getrange");
    for _ in 0..5 {
        let again = source.read().unwrap();
        assert!(Arc::ptr_eq(
            again.get("e0").unwrap().cache.as_ref().unwrap(),
            &digest
        ));
    }
    assert_eq!(calls(&mut con, "getrange") - before, 5, "no digest fetched");

    // Every record refreshes the digest's expiry (a later one than the
    // record's given by hand is brought back to ttl_ms).
    let _: () = redis::cmd("PEXPIRE")
        .arg(&key)
        .arg(600_000)
        .query(&mut con)
        .unwrap();
    wait_for(
        || pttl(&mut con, &key) <= 2000,
        "the expiry refreshed with a heartbeat",
    );

    // The same set: no write; a new one: version 2, read once.
    assert!(!publisher.publish_cache(&[10, 20, 30], 3, 8).unwrap());
    assert!(publisher.publish_cache(&[10, 20], 2, 8).unwrap());
    publisher.publish(Snapshot::default()).unwrap();
    let reading = read_until(&mut *source, "e0", 2);
    let moved = reading.get("e0").unwrap().cache.clone().unwrap();
    assert_eq!((moved.version(), moved.blocks()), (2, &[10, 20][..]));
    assert!(cache_errors(&reading).is_empty());

    // A clean close deletes the digest with the record.
    publisher.close();
    assert_eq!(get(&mut con, &key), None);
    assert_eq!(get(&mut con, &engine_key("rc:", "e0")), None);
}

fn value(pid: u32, generation: u64, version: u64) -> Vec<u8> {
    encode_digest_value(&DigestRecord {
        writer_pid: pid,
        generation,
        digest: CacheDigest::new(version, 1, vec![1, 2, 3]),
        held: 3,
        ..DigestRecord::default()
    })
    .unwrap()
}

fn record(pid: u32, generation: u64) -> Vec<u8> {
    let writer = RecordWriter {
        pid,
        publish_period_us: 50_000,
        generation,
    };
    RedisRecord::active(writer, 1, 1, Snapshot::default())
        .encode()
        .to_vec()
}

/// The owner check of a digest is its engine's record's: a writer whose
/// record does not hold the engine key writes no digest, and deletes only
/// its own.
#[test]
fn the_digest_scripts_check_the_owner() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let (engine, cache) = (engine_key("o:", "e"), cache_key("o:", "e"));
    let set = |con: &mut redis::Connection, value: &[u8]| -> redis::Value {
        redis::cmd("EVAL")
            .arg(SET_CACHE_IF_OWNER_SCRIPT)
            .arg(2)
            .arg(&engine)
            .arg(&cache)
            .arg(value)
            .arg(2000)
            .query(con)
            .unwrap()
    };
    // No record yet, or our own: written.
    assert_eq!(set(&mut con, &value(10, 1, 1)), redis::Value::Int(1));
    let _: () = redis::cmd("SET")
        .arg(&engine)
        .arg(record(10, 1))
        .arg("PX")
        .arg(2000)
        .query(&mut con)
        .unwrap();
    assert_eq!(set(&mut con, &value(10, 1, 2)), redis::Value::Int(1));
    // Another writer's digest (another pid, or another run) is refused: the
    // reply is the holder's record header.
    for (pid, generation) in [(11, 1), (10, 2)] {
        let reply = set(&mut con, &value(pid, generation, 9));
        assert!(
            matches!(&reply, redis::Value::BulkString(h) if h.len() == 64 && h[..8] == *b"ENGSTATE"),
            "{reply:?}"
        );
    }
    let held = decode_digest_value(&get(&mut con, &cache).unwrap()).unwrap();
    assert_eq!(held.digest.version(), 2, "ours kept");

    let delete = |con: &mut redis::Connection, mine: &[u8]| -> i64 {
        redis::cmd("EVAL")
            .arg(DELETE_CACHE_IF_OWNER_SCRIPT)
            .arg(1)
            .arg(&cache)
            .arg(mine)
            .query(con)
            .unwrap()
    };
    assert_eq!(
        delete(&mut con, &record(11, 1)),
        0,
        "another writer's stays"
    );
    assert!(get(&mut con, &cache).is_some());
    assert_eq!(delete(&mut con, &record(10, 1)), 1);
    assert_eq!(get(&mut con, &cache), None);
    // A foreign value at the key is not a digest of anyone's: deleted.
    let _: () = redis::cmd("SET")
        .arg(&cache)
        .arg("junk")
        .query(&mut con)
        .unwrap();
    assert_eq!(delete(&mut con, &record(10, 1)), 1);
}

/// What is not a digest at the key is that engine's `corrupt_cache` error
/// at every read, its state read; a missing digest is reported once.
#[test]
fn a_bad_or_missing_digest_value_is_the_engines_error() {
    let server = RedisServer::start();
    let uri = server.uri("?prefix=bad:");
    let mut con = server.connection();
    let mut publisher = start_publisher(&uri, "b", 20).unwrap();
    let key = cache_key("bad:", "b");
    publisher.publish_cache(&[1, 2], 2, 4).unwrap();
    publisher.publish(Snapshot::default()).unwrap();
    // Wait for the digest, then put junk in its place (a huge value: the
    // read is bounded, one byte past the largest digest).
    wait_for(|| get(&mut con, &key).is_some(), "the digest written");
    let junk = vec![0x5a_u8; 2 * 1024 * 1024];
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(&junk)
        .arg("PX")
        .arg(600_000)
        .query(&mut con)
        .unwrap();
    let mut source = digest_reader(&uri);
    let reading = read_until(&mut *source, "b", 1);
    for reading in [reading, source.read().unwrap()] {
        let state = reading.get("b").unwrap();
        assert!(state.is_fresh() && state.cache.is_none(), "{state:?}");
        let errors = cache_errors(&reading);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].contains("larger than the largest digest")
                && errors[0].contains("bad:cache:b"),
            "{}",
            errors[0]
        );
    }
    // Garbage of a digest's size: not a digest.
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(vec![7u8; 200])
        .arg("PX")
        .arg(600_000)
        .query(&mut con)
        .unwrap();
    publisher.publish_cache(&[1], 1, 4).unwrap();
    // The publisher's version 2 overwrites it; delete it once written, so
    // that the record names a version the key does not hold.
    publisher.publish(Snapshot::default()).unwrap();
    wait_for(
        || get(&mut con, &key).is_some_and(|v| decode_digest_value(&v).is_ok()),
        "version 2 written",
    );
    let version_2 = get(&mut con, &key).unwrap();
    let _: () = redis::cmd("DEL").arg(&key).query(&mut con).unwrap();
    let reading = read_until(&mut *source, "b", 2);
    let errors = cache_errors(&reading);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("holds no value"), "{}", errors[0]);
    let later = source.read().unwrap();
    assert!(
        cache_errors(&later).is_empty(),
        "a missing digest: once per version"
    );
    assert!(later.get("b").unwrap().cache.is_none());
    // Not there is not damage (`missing_cache`), and the source says it
    // again when asked about the engine.
    let fault = source
        .cache_fault(later.get("b").unwrap())
        .expect("asked again");
    assert!(
        matches!(*fault.error, Error::MissingCache { .. }),
        "{fault}"
    );
    // The digest put back without a new version (as a writer that regains
    // its engine id does): fetched again after a while, and used.
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(&version_2)
        .arg("PX")
        .arg(600_000)
        .query(&mut con)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let reading = source.read().unwrap();
        let cache = reading.get("b").unwrap().cache.clone();
        if let Some(digest) = cache {
            assert_eq!((digest.version(), digest.blocks()), (2, &[1][..]));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the missing digest was never fetched again"
        );
        std::thread::yield_now();
    }
    publisher.close();
}

/// A Redis user that may read the records but not the digest keys: each
/// engine's digest is its error; every record is still read (the whole
/// read failed on the refused `GETRANGE`).
#[test]
fn a_reader_refused_the_digest_keys_still_reads_every_record() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "no-digests",
            "on",
            ">nd-pw-314",
            "~ac:engine*",
            "+@all",
        ])
        .query(&mut con)
        .unwrap();
    let mut publisher = start_publisher(&server.uri("?prefix=ac:"), "a", 20).unwrap();
    publisher.publish_cache(&[5, 6], 2, 4).unwrap();
    publisher.publish(Snapshot::default()).unwrap();
    let uri = format!(
        "redis://no-digests:nd-pw-314@127.0.0.1:{}/0?prefix=ac:",
        server.port()
    );
    let mut source = digest_reader(&uri);
    let reading = read_until(&mut *source, "a", 1);
    let state = reading.get("a").unwrap();
    assert!(state.is_fresh() && state.cache.is_none(), "{state:?}");
    let errors = cache_errors(&reading);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("refused GETRANGE")
            && errors[0].contains("no permissions")
            && errors[0].contains("ac:cache:a")
            && !errors[0].contains("nd-pw-314"),
        "{}",
        errors[0]
    );
    publisher.close();
}

/// A TCP proxy to `127.0.0.1:upstream` that, while `stall` is set, stops
/// forwarding a connection (both ways, for good) at the first client
/// command naming `marker`: a server that stalls at exactly that round trip.
fn stalling_proxy(upstream: u16, marker: &'static [u8], stall: Arc<AtomicBool>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { return };
            let mut server = TcpStream::connect(("127.0.0.1", upstream)).unwrap();
            let stalled = Arc::new(AtomicBool::new(false));
            let (mut client_out, mut server_in) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            let replies_stalled = stalled.clone();
            std::thread::spawn(move || {
                let mut buffer = [0u8; 64 * 1024];
                while let Ok(n @ 1..) = server_in.read(&mut buffer) {
                    if replies_stalled.load(Ordering::SeqCst)
                        || client_out.write_all(&buffer[..n]).is_err()
                    {
                        return;
                    }
                }
            });
            let stall = stall.clone();
            std::thread::spawn(move || {
                let mut buffer = [0u8; 64 * 1024];
                while let Ok(n @ 1..) = client.read(&mut buffer) {
                    let named = buffer[..n].windows(marker.len()).any(|w| w == marker);
                    if named && stall.load(Ordering::SeqCst) {
                        // Hold both sockets open, silent: the reader waits
                        // out its timeout; swallow what it sends until it
                        // drops the connection.
                        stalled.store(true, Ordering::SeqCst);
                        let _server = server;
                        while let Ok(1..) = client.read(&mut buffer) {}
                        return;
                    }
                    if server.write_all(&buffer[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// The connection stalls during the digests' round trip (after the records
/// were read): the records stay read, the digest is that engine's error,
/// and the next read reconnects and fetches it (the whole read failed).
#[test]
fn a_connection_that_stalls_while_fetching_digests_costs_only_the_digests() {
    let server = RedisServer::start();
    let mut publisher = start_publisher(&server.uri("?prefix=st:"), "s", 20).unwrap();
    publisher.publish_cache(&[7, 8, 9], 3, 4).unwrap();
    publisher.publish(Snapshot::default()).unwrap();
    let stall = Arc::new(AtomicBool::new(true));
    let port = stalling_proxy(server.port(), b"st:cache:s", stall.clone());
    let mut source = digest_reader(&format!(
        "redis://127.0.0.1:{port}/0?prefix=st:&timeout_ms=1000"
    ));
    let reading = read_until(&mut *source, "s", 1);
    let state = reading.get("s").unwrap();
    assert!(state.is_fresh() && state.cache.is_none(), "{state:?}");
    let errors = cache_errors(&reading);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("timed out") && errors[0].contains("fetched again"),
        "{}",
        errors[0]
    );
    stall.store(false, Ordering::SeqCst);
    let mut reading = Reading::default();
    wait_for(
        || {
            source.read_into(&mut reading).unwrap();
            reading.get("s").is_some_and(|s| s.cache.is_some())
        },
        "the digest fetched after the stall",
    );
    let digest = reading.get("s").unwrap().cache.clone().unwrap();
    assert_eq!(digest.blocks(), &[7, 8, 9]);
    assert!(cache_errors(&reading).is_empty(), "{reading:?}");
    publisher.close();
}

/// Redis loses the digest key (here `DEL`; in production a restart without
/// persistence, `FLUSHALL`, or an expiry while the writer was cut off)
/// while the digest does not change: the publisher writes it again before
/// its next record (it sends a digest only on change, so the records named
/// a key that stayed missing).
#[test]
fn a_digest_key_that_redis_lost_is_written_again() {
    let server = RedisServer::start();
    let uri = server.uri("?prefix=lost:");
    let mut con = server.connection();
    let mut publisher = start_publisher(&uri, "l", 20).unwrap();
    let key = cache_key("lost:", "l");
    publisher.publish_cache(&[11, 12], 2, 4).unwrap();
    publisher.publish(Snapshot::default()).unwrap();
    wait_for(|| get(&mut con, &key).is_some(), "the digest written");
    let _: () = redis::cmd("DEL").arg(&key).query(&mut con).unwrap();
    let mut step = 0;
    wait_for(
        || {
            step += 1;
            publisher
                .publish(Snapshot {
                    step,
                    ..Snapshot::default()
                })
                .unwrap();
            get(&mut con, &key).is_some()
        },
        "the lost digest written again",
    );
    let value = decode_digest_value(&get(&mut con, &key).unwrap()).unwrap();
    assert_eq!(
        (value.digest.version(), value.digest.blocks()),
        (1, &[11, 12][..])
    );
    let mut source = digest_reader(&uri);
    let reading = read_until(&mut *source, "l", 1);
    assert!(cache_errors(&reading).is_empty(), "{reading:?}");
    assert_eq!(
        reading.get("l").unwrap().cache.as_ref().unwrap().blocks(),
        &[11, 12]
    );
    publisher.close();
}

/// The KV block size goes into the Redis value's header, and a new one
/// writes the digest again even for an unchanged set.
#[test]
fn a_new_kv_block_size_writes_the_redis_digest_again() {
    let server = RedisServer::start();
    let uri = server.uri("?prefix=kv:");
    let mut con = server.connection();
    let mut publisher = start_publisher(&uri, "k", 20).unwrap();
    let key = cache_key("kv:", "k");
    assert!(publisher.publish_cache(&[5, 6], 2, 4).unwrap());
    publisher.set_cache_kv_block_size(16);
    assert!(
        publisher.publish_cache(&[5, 6], 2, 4).unwrap(),
        "an unchanged set with a new block size is written again"
    );
    assert!(!publisher.publish_cache(&[6, 5], 2, 4).unwrap());
    publisher.publish(Snapshot::default()).unwrap();
    wait_for(
        || {
            get(&mut con, &key)
                .and_then(|v| decode_digest_value(&v).ok())
                .is_some_and(|r| r.digest.version() == 2)
        },
        "version 2 written",
    );
    let record = decode_digest_value(&get(&mut con, &key).unwrap()).unwrap();
    assert_eq!(record.kv_block_size, 16);
    publisher.close();
}
