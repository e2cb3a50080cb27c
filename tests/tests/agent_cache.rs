//! esagent relays cache digests (docs/FORMAT.md, "On Redis"): a publisher
//! writes digests into shared memory, the agent relays each changed one
//! before the record naming it, a Redis reader gets what a shared-memory
//! reader gets, a removed engine's digest key goes with its record, and a
//! damaged digest is counted while its records name no digest.

use std::io::{Seek, SeekFrom, Write};

use engine_state_reader::{ReaderOptions, ShmDir};
use engine_state_redis::cache_key;
use engine_state_shm_format::{
    cache_dir, decode_digest_value, monotonic_ns, CacheDigest, DigestOptions, DigestWriter,
    EngineId, ShmWriter, Snapshot, WriterOptions,
};
use engine_state_tests::*;

fn agent(dir: &std::path::Path, redis_uri: &str) -> InProcessAgent {
    let uri = format!("file://{}", dir.display());
    InProcessAgent::start(&["--uri", &uri, "--redis", redis_uri, "--period-ms", "20"])
}

#[test]
fn digests_are_relayed_on_change_and_deleted_with_the_engine() {
    let redis = RedisServer::start();
    let redis_uri = redis.uri("?prefix=c:&ttl_ms=2000");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("engines");
    let file_uri = format!("file://{}", dir.display());
    let mut publisher = start_publisher(&file_uri, "e0", 20).unwrap();
    assert!(publisher.publish_cache(&[30, 10, 20], 3, 16).unwrap());
    publisher.publish(Snapshot::default()).unwrap();
    let agent = agent(&dir, &redis_uri);
    let mut con = redis.connection();
    let key = cache_key("c:", "e0");

    // (a) The digest arrives and decodes to the published blocks, with the
    // relayed record's generation; a Redis reader gets what a shm reader gets.
    wait_for(|| get(&mut con, &key).is_some(), "the relayed digest");
    let value = decode_digest_value(&get(&mut con, &key).unwrap()).unwrap();
    assert_eq!(value.digest.blocks(), &[10, 20, 30]);
    assert_eq!(value.digest.version(), 1);
    let mut remote = digest_reader(&redis_uri);
    let there = wait_for_engine(&mut *remote, "e0", "a record with its digest", |e| {
        e.cache.is_some()
    });
    assert_eq!(value.generation, there.generation);
    let mut local = ShmDir::open(&dir, ReaderOptions::default().with_cache_digests(true)).unwrap();
    let here = local.read_engine("e0").unwrap().unwrap();
    assert_eq!(here.cache.as_deref(), there.cache.as_deref());
    assert_eq!(
        (there.snapshot.cache_blocks, there.snapshot.cache_version),
        (3, 1)
    );
    // (e) The gauge is the published count.
    wait_for(
        || {
            sample(
                &http_get(agent.addr(), "/metrics").1,
                r#"engine_state_cache_blocks{engine="e0"}"#,
            ) == Some(3.0)
        },
        "the cache_blocks gauge",
    );

    // (b) An unchanged digest is not sent again: a marker put into the
    // value's reserved word (bytes 56-63, not validated) survives records
    // that name the same version.
    let mut marked = get(&mut con, &key).unwrap();
    marked[56] = 0x5a;
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(&marked)
        .arg("KEEPTTL")
        .query(&mut con)
        .unwrap();
    for running in 1..=5 {
        publisher
            .publish(Snapshot {
                num_running: running,
                ..Snapshot::default()
            })
            .unwrap();
        wait_for_engine(&mut *remote, "e0", "the new snapshot", |e| {
            e.snapshot.num_running == running
        });
    }
    assert_eq!(
        get(&mut con, &key).unwrap(),
        marked,
        "the digest was written again"
    );
    // A changed one is.
    assert!(publisher.publish_cache(&[10, 20], 2, 16).unwrap());
    publisher.publish(Snapshot::default()).unwrap();
    let there = wait_for_engine(&mut *remote, "e0", "digest version 2", |e| {
        e.cache.as_ref().is_some_and(|d| d.version() == 2)
    });
    assert_eq!(there.cache.unwrap().blocks(), &[10, 20]);
    assert_eq!(there.snapshot.cache_blocks, 2);
    let value = decode_digest_value(&get(&mut con, &key).unwrap()).unwrap();
    assert_eq!(
        (value.digest.version(), value.digest.blocks()),
        (2, &[10, 20][..])
    );

    // (c) The engine leaves: its digest key goes with its record.
    drop(publisher);
    wait_for(|| get(&mut con, &key).is_none(), "the digest key deleted");
    assert!(get(&mut con, "c:engine:e0").is_none());
}

/// A digest cut to its capacity (held 9, 3 entries) of an engine whose KV
/// blocks are 16 tokens is relayed as its file says: the Redis value and a
/// Redis reader's digest keep `held` and `kv_block_size`.
#[test]
fn a_relayed_digest_keeps_held_and_the_kv_block_size() {
    let redis = RedisServer::start();
    let redis_uri = redis.uri("?prefix=h:&ttl_ms=2000");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("engines");
    std::fs::create_dir(&dir).unwrap();
    let id = EngineId::new("e0").unwrap();
    let snapshot = |version: u64| Snapshot {
        captured_mono_ns: monotonic_ns(),
        cache_blocks: 3,
        cache_version: version,
        ..Snapshot::default()
    };
    let mut engine = ShmWriter::create(&dir, &id, &WriterOptions::default(), &snapshot(0)).unwrap();
    let options = DigestOptions {
        capacity: 4,
        generation: engine.generation(),
        kv_block_size: 16,
        ..DigestOptions::default()
    };
    let cut = CacheDigest::new(1, monotonic_ns(), vec![10, 20, 30]);
    let _digest = DigestWriter::create(&dir, &id, &options, &cut, 9, 0).unwrap();
    let _agent = agent(&dir, &redis_uri);
    let mut con = redis.connection();
    let key = cache_key("h:", "e0");
    let mut publish = || {
        engine.publish(&snapshot(1)).unwrap();
        engine.stamp_heartbeat(monotonic_ns());
    };
    wait_for(
        || {
            publish();
            get(&mut con, &key).is_some()
        },
        "the relayed digest",
    );
    let value = decode_digest_value(&get(&mut con, &key).unwrap()).unwrap();
    assert_eq!(value.digest.blocks(), &[10, 20, 30]);
    assert_eq!((value.held, value.kv_block_size), (9, 16));
    let mut remote = digest_reader(&redis_uri);
    let mut there = None;
    wait_for(
        || {
            publish();
            there = remote
                .read()
                .unwrap()
                .get("e0")
                .and_then(|e| e.cache.clone());
            there.is_some()
        },
        "a record with its digest",
    );
    let there = there.unwrap();
    assert_eq!((there.held(), there.kv_block_size()), (9, 16));
    // What a shared-memory reader of the file gets.
    let mut here = ShmDir::open(&dir, ReaderOptions::default().with_cache_digests(true)).unwrap();
    publish();
    let here = here.read_engine("e0").unwrap().unwrap().cache.unwrap();
    assert_eq!(*here, *there);
}

#[test]
fn a_damaged_digest_is_counted_and_its_records_name_no_digest() {
    let redis = RedisServer::start();
    let redis_uri = redis.uri("?prefix=d:&ttl_ms=2000");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("engines");
    let file_uri = format!("file://{}", dir.display());
    let mut good = start_publisher(&file_uri, "good", 20).unwrap();
    let mut bad = start_publisher(&file_uri, "bad", 20).unwrap();
    for publisher in [&mut good, &mut bad] {
        assert!(publisher.publish_cache(&[1, 2], 2, 8).unwrap());
        publisher
            .publish(Snapshot {
                num_running: 7,
                ..Snapshot::default()
            })
            .unwrap();
    }
    // Garbage over the digest's header, in place (the size stays).
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(cache_dir(&dir).join("bad"))
        .unwrap();
    file.seek(SeekFrom::Start(0)).unwrap();
    file.write_all(&[0xee; 64]).unwrap();
    drop(file);

    let agent = agent(&dir, &redis_uri);
    let mut con = redis.connection();
    let mut remote = digest_reader(&redis_uri);
    let bad_state = wait_for_engine(&mut *remote, "bad", "the damaged engine's record", |e| {
        e.snapshot.num_running == 7
    });
    // Relayed, naming no digest (none is in Redis).
    assert_eq!(
        (
            bad_state.snapshot.cache_blocks,
            bad_state.snapshot.cache_version
        ),
        (0, 0)
    );
    assert!(get(&mut con, &cache_key("d:", "bad")).is_none());
    // The other engine's digest is relayed.
    wait_for_engine(&mut *remote, "good", "the good digest", |e| {
        e.cache.is_some()
    });
    // Counted as a read error.
    wait_for(
        || {
            sample(
                &http_get(agent.addr(), "/metrics").1,
                "engine_state_read_errors_total",
            )
            .is_some_and(|n| n >= 1.0)
        },
        "the digest error counted",
    );
    drop(good);
    drop(bad);
}
