//! One live writer per engine id in Redis, whoever writes: the node agent's
//! relay (an owner-checked `InlineSink`) never overwrites the key of a
//! direct publisher of the same id, says so once, counts it, and takes the
//! id over once that publisher is gone; while it holds a key it writes
//! plain `SET`s, not the owner-check script.

use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use engine_state_publisher::{Publisher, PublisherConfig};
use engine_state_reader::Source;
use engine_state_redis::{InlineSink, SinkOp};
use engine_state_redis::{RedisRecord, RedisTarget, STATE_ACTIVE};
use engine_state_shm_format::{monotonic_ns, Snapshot};
use engine_state_tests::*;

fn start(uri: &str, id: &str) -> Result<Publisher, engine_state_publisher::Error> {
    Publisher::start(PublisherConfig::resolve(Some(uri), Some(id), Some(20), None).unwrap())
}

/// `esagent` relaying `dir` to `redis_uri` every 20 ms; its HTTP address.
fn relaying_esagent(dir: &std::path::Path, redis_uri: &str) -> (Proc, String) {
    esagent_process(
        Command::new(bin("esagent"))
            .args(["--uri", &format!("file://{}", dir.display())])
            .args(["--redis", redis_uri, "--period-ms", "20"])
            .args(["--listen", "127.0.0.1:0"]),
    )
}

fn running(source: &mut dyn Source, id: &str) -> Option<u64> {
    let reading = source.read().unwrap();
    reading.get(id).map(|e| e.snapshot.num_running)
}

/// A record of the relay's kind: the file's writer (pid, generation).
fn relayed(id: &Arc<str>, running: u64, seq: u64) -> (Arc<str>, SinkOp) {
    let record = RedisRecord {
        writer_pid: 777_001,
        state: STATE_ACTIVE,
        generation: 5,
        heartbeat_seq: seq,
        heartbeat_mono_ns: monotonic_ns(),
        snapshot: Snapshot {
            num_running: running,
            captured_mono_ns: monotonic_ns(),
            ..Snapshot::default()
        },
        ..RedisRecord::default()
    };
    (id.clone(), SinkOp::Set(record))
}

/// `calls` of `command` in `INFO commandstats`.
fn calls(redis: &RedisServer, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut redis.connection())
        .unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

#[test]
fn an_owner_checked_inline_sink_leaves_a_live_publishers_key_alone() {
    let redis = RedisServer::start();
    let uri = redis.uri("?prefix=own:&ttl_ms=1000");
    let target = RedisTarget::parse(&uri).unwrap();
    let mut sink =
        InlineSink::new(target.clone(), Some(target.connect().unwrap()), None).owner_checked();
    let mut source = test_reader(&uri, Duration::from_secs(5));
    let id: Arc<str> = "both".into();

    let mut publisher = start(&uri, "both").unwrap();
    publisher
        .publish(Snapshot {
            num_running: 42,
            ..Snapshot::default()
        })
        .unwrap();
    wait_for(
        || running(&mut *source, "both") == Some(42),
        "the publisher's record",
    );
    for seq in 1..=20 {
        sink.submit(&mut vec![relayed(&id, 1, seq)]);
        assert!(sink.flush(Duration::from_secs(5)));
        assert_eq!(running(&mut *source, "both"), Some(42), "write {seq}");
    }
    let count = |sink: &InlineSink| {
        let stats = sink.stats();
        [&stats.refused, &stats.written, &stats.errors].map(|c| c.load(Ordering::Relaxed))
    };
    assert_eq!(count(&sink), [20, 0, 0], "refused, written, errors");
    // A delete (the engine's file left) leaves the publisher's key too.
    sink.submit(&mut vec![(id.clone(), SinkOp::Delete)]);
    assert!(sink.flush(Duration::from_secs(5)));
    assert_eq!(running(&mut *source, "both"), Some(42));

    // The publisher closes (its key is deleted): the relay takes the id.
    publisher.close();
    sink.submit(&mut vec![relayed(&id, 1, 21)]);
    assert!(sink.flush(Duration::from_secs(5)));
    assert_eq!(running(&mut *source, "both"), Some(1));
    assert_eq!(count(&sink), [20, 1, 0]);
    // And now a direct publisher of the id is refused while the relay holds it.
    let error = start(&uri, "both").expect_err("the relay holds the id");
    assert!(
        error
            .to_string()
            .contains("already published by a live process"),
        "{error}"
    );
}

#[test]
fn a_held_key_is_written_with_plain_sets_and_claimed_again_after_a_gap() {
    let redis = RedisServer::start();
    // Held for half of what ttl_ms leaves after timeout_ms (1.5 s with the
    // writers' 1 s): the writes below are far closer together.
    let uri = redis.uri("?prefix=held:&ttl_ms=4000");
    let target = RedisTarget::parse(&uri).unwrap();
    let mut sink =
        InlineSink::new(target.clone(), Some(target.connect().unwrap()), None).owner_checked();
    let id: Arc<str> = "e".into();
    let (evals, sets) = (calls(&redis, "eval"), calls(&redis, "set"));
    for seq in 1..=10 {
        sink.submit(&mut vec![relayed(&id, seq, seq)]);
        assert!(sink.flush(Duration::from_secs(5)));
    }
    assert_eq!(sink.stats().written.load(Ordering::Relaxed), 10);
    // (A script's own SET counts as a SET too.)
    assert_eq!(calls(&redis, "eval") - evals, 1, "one claim");
    assert_eq!(calls(&redis, "set") - sets, 10, "one SET per write");
    // Longer than the hold since the last write: claimed again.
    // Real time: the hold is timed by the sink's own `Instant` (inside
    // engine-state-redis, no clock passed in).
    std::thread::sleep(Duration::from_millis(2100));
    sink.submit(&mut vec![relayed(&id, 11, 11)]);
    assert!(sink.flush(Duration::from_secs(5)));
    assert_eq!(calls(&redis, "eval") - evals, 2);
    // A clean delete is owner-checked too (the script, not DEL).
    sink.submit(&mut vec![(id.clone(), SinkOp::Delete)]);
    assert!(sink.flush(Duration::from_secs(5)));
    assert_eq!(calls(&redis, "eval") - evals, 3);
    let mut source = test_reader(&uri, Duration::from_secs(5));
    assert_eq!(running(&mut *source, "e"), None);
}

/// The same through `esagent`: an engine publishing into the agent's
/// directory under an id a direct publisher holds in Redis.
#[test]
fn esagent_does_not_overwrite_a_direct_publisher_and_reports_it_once() {
    let redis = RedisServer::start();
    let uri = redis.uri("?prefix=mixed:&ttl_ms=1000");
    let dir = tempfile::tempdir().unwrap();
    let mut direct = start(&uri, "twin").unwrap();
    direct
        .publish(Snapshot {
            num_running: 42,
            ..Snapshot::default()
        })
        .unwrap();
    let mut local = start(&format!("file://{}", dir.path().display()), "twin").unwrap();
    local
        .publish(Snapshot {
            num_running: 1,
            ..Snapshot::default()
        })
        .unwrap();
    let (mut agent, addr) = relaying_esagent(dir.path(), &uri);
    let refused = || {
        let metrics = http_get(&addr, "/metrics").1;
        metrics.lines().find_map(|line| {
            line.strip_prefix("engine_state_relay_refused_total ")
                .map(|v| v.parse::<f64>().unwrap())
        })
    };
    wait_for(
        || refused().is_some_and(|n| n > 0.0),
        "refused relay writes in /metrics",
    );
    let mut source = test_reader(&uri, Duration::from_secs(5));
    for _ in 0..50 {
        assert_eq!(running(&mut *source, "twin"), Some(42));
        // A non-event over time (the agent's relay in its own threads keeps
        // being refused): reads half a second long.
        std::thread::sleep(Duration::from_millis(10));
    }
    // The direct publisher stops: the agent relays the local engine.
    direct.close();
    wait_for(
        || running(&mut *source, "twin") == Some(1),
        "the agent to take the id over",
    );
    nix::sys::signal::kill(agent.pid(), nix::sys::signal::Signal::SIGTERM).unwrap();
    assert!(agent.0.wait().unwrap().success());
    let stderr = stderr_of(&mut agent);
    assert_eq!(
        stderr.matches("is written by another live process").count(),
        1,
        "{stderr}"
    );
    // Through esagent's tracing subscriber (levels, RUST_LOG), not a bare
    // eprintln beside it.
    let line = stderr
        .lines()
        .find(|l| l.contains("is written by another live process"))
        .unwrap();
    assert!(line.contains("WARN"), "{line}");
    assert!(stderr.contains("\"twin\""), "{stderr}");
    assert_eq!(
        stderr.matches("the other writer's key is gone").count(),
        1,
        "{stderr}"
    );
}

/// Two hosts relay one engine id whose writers have the same pid (engines
/// in containers: every pod's engine is pid 1 or 7) in fresh files (both
/// generation 1): the relayed records name different writers (the files'
/// creation times), so the second relay is refused while the first holds
/// the key, and its delete (its engine left) leaves the first's key alone.
#[test]
fn two_relays_of_one_engine_id_with_the_same_writer_pid_do_not_share_the_key() {
    use clap::Parser;
    use engine_state_agent::{Args, Relay};
    use engine_state_shm_format::{EngineId, ShmWriter, WriterOptions};

    let redis = RedisServer::start();
    let uri = redis.uri("?prefix=pods:&ttl_ms=4000");
    let id = EngineId::new("pod-engine").unwrap();
    let host = |running| {
        let dir = tempfile::tempdir().unwrap();
        let snapshot = Snapshot {
            num_running: running,
            captured_mono_ns: monotonic_ns(),
            ..Snapshot::default()
        };
        let writer =
            ShmWriter::create(dir.path(), &id, &WriterOptions::default(), &snapshot).unwrap();
        let config = Args::parse_from([
            "esagent",
            "--uri",
            &format!("file://{}", dir.path().display()),
            "--redis",
            &uri,
        ])
        .into_config()
        .unwrap();
        let relay = Relay::new(&config).unwrap();
        (dir, writer, relay)
    };
    let (_dir_a, writer_a, mut relay_a) = host(1);
    let (_dir_b, writer_b, mut relay_b) = host(2);
    // The premise: what a container's engine looks like on two hosts.
    assert_eq!(writer_a.generation(), 1);
    assert_eq!(writer_b.generation(), 1);
    let stats = |relay: &Relay| {
        let stats = relay.sink_stats().unwrap();
        [&stats.refused, &stats.written, &stats.errors].map(|c| c.load(Ordering::Relaxed))
    };
    let mut source = test_reader(&uri, Duration::from_secs(5));

    assert_eq!(relay_a.poll(), 1);
    relay_a.shutdown(Duration::from_secs(5));
    assert_eq!(stats(&relay_a), [0, 1, 0], "refused, written, errors");
    assert_eq!(running(&mut *source, "pod-engine"), Some(1));

    assert_eq!(relay_b.poll(), 1);
    relay_b.shutdown(Duration::from_secs(5));
    assert_eq!(stats(&relay_b), [1, 0, 0], "refused, written, errors");
    assert_eq!(running(&mut *source, "pod-engine"), Some(1));

    // B's engine closes (its file is removed): B deletes only its own key.
    drop(writer_b);
    wait_for(
        || relay_b.tick().removed == 1,
        "relay B to see its engine leave",
    );
    relay_b.shutdown(Duration::from_secs(5));
    assert_eq!(running(&mut *source, "pod-engine"), Some(1));
    drop(writer_a);
}

/// A truncation makes the publisher rename a new file (a new run) over its
/// own: the relay's key then holds the relay's own record of the old file,
/// which the owner check took for another live process's ("written by
/// another live process", and the new run refused until the key expired).
/// Now the relay takes its own key over quietly.
#[test]
fn esagent_takes_over_its_own_record_after_a_truncation_quietly() {
    let redis = RedisServer::start();
    // The key is held (plain SETs, no owner check) for (ttl - timeout) / 2
    // = 250 ms after a write and expires 3 s after it; the publisher checks
    // its file every 4 periods (800 ms): the new run's first record is
    // owner-checked against the old record, still there.
    let uri = redis.uri("?prefix=own:&ttl_ms=3000&timeout_ms=2500");
    let dir = tempfile::tempdir().unwrap();
    let shm_uri = format!("file://{}", dir.path().display());
    let mut local = Publisher::start(
        PublisherConfig::resolve(Some(&shm_uri), Some("self"), Some(200), None).unwrap(),
    )
    .unwrap();
    local
        .publish(Snapshot {
            num_running: 3,
            ..Snapshot::default()
        })
        .unwrap();
    let (mut agent, _addr) = relaying_esagent(dir.path(), &uri);
    let mut source = test_reader(&uri, Duration::from_secs(5));
    let mut generation = 0;
    wait_for(
        || {
            let reading = source.read().unwrap();
            generation = reading.get("self").map_or(0, |e| e.generation);
            generation != 0
        },
        "the relayed engine in Redis",
    );
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("self"))
        .unwrap()
        .set_len(0)
        .unwrap();
    wait_for(
        || {
            let reading = source.read().unwrap();
            reading
                .get("self")
                .is_some_and(|e| e.generation != generation && e.is_fresh())
        },
        "the new file's run relayed to Redis",
    );
    nix::sys::signal::kill(agent.pid(), nix::sys::signal::Signal::SIGTERM).unwrap();
    assert!(agent.0.wait().unwrap().success());
    let stderr = stderr_of(&mut agent);
    assert!(
        !stderr.contains("is written by another live process"),
        "{stderr}"
    );
    local.close();
}

/// The relay's delete of its own record of an engine's previous run, then
/// the new run's record, lost with the connection: both are written once it
/// is back, in order. (One op was kept per engine, the record replaced the
/// delete, and the owner check took the relay's own old record for another
/// live writer's: the new run was refused until that key expired.)
#[test]
fn a_delete_before_a_new_run_survives_a_lost_connection() {
    let redis = RedisServer::start();
    let uri = redis.uri("?prefix=rerun:&ttl_ms=60000");
    let target = RedisTarget::parse(&uri).unwrap();
    let mut sink =
        InlineSink::new(target.clone(), Some(target.connect().unwrap()), None).owner_checked();
    let mut source = test_reader(&uri, Duration::from_secs(5));
    let id: Arc<str> = "rerun".into();
    sink.submit(&mut vec![relayed(&id, 1, 1)]);
    assert!(sink.flush(Duration::from_secs(5)));
    assert_eq!(running(&mut *source, "rerun"), Some(1));

    // The sink's connection is lost (the server closes it); the key stays.
    let _: redis::Value = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query(&mut redis.connection())
        .unwrap();
    // A new run of the engine (another writer, generation): as the relay
    // sends it, its own old record deleted first.
    let (_, SinkOp::Set(mut next)) = relayed(&id, 2, 2) else {
        unreachable!()
    };
    next.writer_pid = 777_002;
    next.generation = 6;
    sink.submit(&mut vec![
        (id.clone(), SinkOp::Delete),
        (id.clone(), SinkOp::Set(next)),
    ]);
    assert!(sink.flush(Duration::from_secs(10)));
    wait_for(
        || running(&mut *source, "rerun") == Some(2),
        "the new run's record",
    );
    assert_eq!(sink.stats().refused.load(Ordering::Relaxed), 0);
}
