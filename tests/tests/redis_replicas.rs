//! Router replicas' reservations on Redis (docs/REDIS.md, "Router replicas'
//! reservations"), against a real redis-server: the sink writes a change
//! within its flush bound and batches many into few writes, a displaced
//! writer never overwrites, a killed writer's key expires, a clean close
//! deletes, and a reader reports malformed values per replica.

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use engine_state_redis::{
    router_key, router_registry_key, Error, RedisReplicas, RedisTarget, ReplicaSink,
    ReplicaSinkOptions, RouterValue, DELETE_ROUTER_IF_OWNER_SCRIPT, SET_ROUTER_IF_OWNER_SCRIPT,
    SET_ROUTER_IF_OWNER_SCRIPT_SHA1, STATE_ACTIVE,
};
use engine_state_shm_format::{EngineId, Reservations};
use engine_state_tests::{get, wait_for, wait_for_within, Proc, RedisServer};

fn id(s: &str) -> EngineId {
    EngineId::new(s).unwrap()
}

fn counters(n: u64) -> Reservations {
    Reservations {
        num_requests: n,
        ongoing_tokens: 100 * n,
        pending_prefill_tokens: 10 * n,
        ongoing_decode_tokens: 90 * n,
        num_prefilling: n.min(3),
        max_prefill_remaining: 7 * n,
    }
}

fn sink(
    server: &RedisServer,
    suffix: &str,
    replica: &str,
    options: ReplicaSinkOptions,
) -> ReplicaSink {
    let target = RedisTarget::parse(&server.uri(suffix)).unwrap();
    ReplicaSink::start(target, &id(replica), options).unwrap()
}

/// The value at `key`, decoded (None: no key).
fn value_at(con: &mut redis::Connection, key: &str) -> Option<RouterValue> {
    get(con, key).map(|bytes| RouterValue::decode(key, &bytes).unwrap())
}

fn counters_of(value: &RouterValue, engine: &str) -> Option<Reservations> {
    value
        .engines
        .iter()
        .find(|(e, _)| e.as_str() == engine)
        .map(|(_, c)| *c)
}

fn is_member(con: &mut redis::Connection, set: &str, member: &str) -> bool {
    redis::cmd("SISMEMBER")
        .arg(set)
        .arg(member)
        .query(con)
        .unwrap()
}

#[test]
fn the_sha1_is_the_router_scripts() {
    let server = RedisServer::start();
    let loaded: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(SET_ROUTER_IF_OWNER_SCRIPT)
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(loaded, SET_ROUTER_IF_OWNER_SCRIPT_SHA1);
    // The delete script at least compiles on the server.
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(DELETE_ROUTER_IF_OWNER_SCRIPT)
        .query(&mut server.connection())
        .unwrap();
}

/// A change reaches Redis within the flush interval plus a round trip
/// (measured from `set` to the value readable by another client), and the
/// sink registers the replica.
#[test]
fn a_change_is_written_within_the_flush_bound() {
    let server = RedisServer::start();
    let options = ReplicaSinkOptions {
        // The heartbeat would write too: a long one isolates the change.
        heartbeat_period: Duration::from_secs(1),
        ..ReplicaSinkOptions::default()
    };
    let sink = sink(&server, "?prefix=lat:", "r0", options);
    let mut con = server.connection();
    let key = router_key("lat:", "r0");
    // The claim at start: an empty value, registered.
    let first = value_at(&mut con, &key).expect("claimed at start");
    assert!(first.engines.is_empty());
    assert_eq!(first.state, STATE_ACTIVE);
    assert_eq!(first.writer_pid, std::process::id());
    assert!(is_member(&mut con, &router_registry_key("lat:"), "r0"));
    let mut latencies = Vec::new();
    for n in 1..=20u64 {
        // Changes at least a flush interval apart: each is written at once.
        std::thread::sleep(Duration::from_millis(6));
        let set_at = Instant::now();
        sink.set("e0", &counters(n)).unwrap();
        loop {
            let seen = value_at(&mut con, &key).and_then(|v| counters_of(&v, "e0"));
            if seen == Some(counters(n)) {
                break;
            }
            assert!(
                set_at.elapsed() < Duration::from_secs(2),
                "change {n} not written"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        latencies.push(set_at.elapsed());
    }
    latencies.sort();
    let (p50, max) = (
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1],
    );
    eprintln!("set → visible: p50 {p50:?}, max {max:?}");
    // 5 ms flush + a round trip; generous for a busy shared VM.
    assert!(p50 < Duration::from_millis(20), "p50 {p50:?}");
    assert_eq!(sink.stats().errors.load(Ordering::Relaxed), 0);
}

/// `INFO commandstats` calls of `command`.
fn calls(con: &mut redis::Connection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con).unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Changes in a tight loop for 100 ms, over 8 engines: written as about one
/// value per flush interval (5 ms), each carrying every engine's counters;
/// the last value holds the last counters of each.
#[test]
fn many_changes_share_few_writes() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let options = ReplicaSinkOptions {
        heartbeat_period: Duration::from_secs(1),
        ..ReplicaSinkOptions::default()
    };
    let sink = sink(&server, "?prefix=batch:", "r0", options);
    assert!(sink.flush(Duration::from_secs(2)));
    let written_before = sink.stats().written.load(Ordering::Relaxed);
    let scripts_before = calls(&mut con, "evalsha") + calls(&mut con, "eval");
    let started = Instant::now();
    let mut changes = 0u64;
    let mut last = [0u64; 8];
    while started.elapsed() < Duration::from_millis(100) {
        for _ in 0..100 {
            changes += 1;
            let engine = (changes % 8) as usize;
            sink.set(&format!("e{engine}"), &counters(changes)).unwrap();
            last[engine] = changes;
        }
    }
    let spent = started.elapsed();
    assert!(sink.flush(Duration::from_secs(2)));
    let writes = sink.stats().written.load(Ordering::Relaxed) - written_before;
    let scripts = calls(&mut con, "evalsha") + calls(&mut con, "eval") - scripts_before;
    // At most one write per flush interval while changing, plus the last;
    // and some while the changes go on (not only at the end).
    let bound = spent.as_millis() as u64 / 5 + 2;
    eprintln!(
        "{changes} changes in {spent:?} ({:?} per set): {writes} writes ({scripts} scripts on \
         the server)",
        spent / changes as u32
    );
    assert!(
        (3..=bound).contains(&writes),
        "{writes} writes, bound {bound}"
    );
    assert_eq!(
        scripts, writes,
        "the server ran as many scripts as were written"
    );
    assert_eq!(
        sink.stats().replaced.load(Ordering::Relaxed),
        changes - writes,
        "every other change joined a write already due"
    );
    let value = value_at(&mut con, &router_key("batch:", "r0")).unwrap();
    assert_eq!(value.engines.len(), 8);
    for (engine, last) in last.iter().enumerate() {
        assert_eq!(
            counters_of(&value, &format!("e{engine}")),
            Some(counters(*last)),
            "e{engine}"
        );
    }
    // A removed engine leaves the next value.
    assert!(sink.remove("e3"));
    assert!(!sink.remove("e3"));
    assert!(sink.flush(Duration::from_secs(2)));
    let value = value_at(&mut con, &router_key("batch:", "r0")).unwrap();
    assert_eq!(value.engines.len(), 7);
    assert_eq!(counters_of(&value, "e3"), None);
    assert_eq!(counters_of(&value, "e7"), Some(counters(last[7])));
}

#[test]
fn bad_engine_ids_and_too_many_engines_are_refused() {
    let server = RedisServer::start();
    let sink = sink(&server, "?prefix=cap:", "r0", ReplicaSinkOptions::default());
    let error = sink.set("not an id", &counters(1)).unwrap_err().to_string();
    assert!(error.contains("outside [A-Za-z0-9._-]"), "{error}");
    for n in 0..256 {
        sink.set(&format!("e{n}"), &counters(1)).unwrap();
    }
    let error = sink.set("e256", &counters(1)).unwrap_err().to_string();
    assert!(error.contains("256 engines"), "{error}");
    // Known engines still change.
    sink.set("e0", &counters(2)).unwrap();
    assert!(sink.flush(Duration::from_secs(2)));
    let value = value_at(&mut server.connection(), &router_key("cap:", "r0")).unwrap();
    assert_eq!(value.engines.len(), 256);
    assert_eq!(counters_of(&value, "e0"), Some(counters(2)));
}

/// Another writer's ACTIVE value (another pid or generation): a second sink
/// is refused at start, and a running sink that lost its key never
/// overwrites it, nor deletes it on close; it writes again once it is gone.
#[test]
fn a_displaced_writer_never_overwrites() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let key = router_key("own:", "r0");
    let options = ReplicaSinkOptions {
        heartbeat_period: Duration::from_millis(20),
        ..ReplicaSinkOptions::default()
    };
    let mut sink_a = sink(&server, "?prefix=own:", "r0", options);
    let target = RedisTarget::parse(&server.uri("?prefix=own:")).unwrap();
    let other = ReplicaSinkOptions {
        generation: options.generation + 1,
        ..options
    };
    match ReplicaSink::start(target, &id("r0"), other) {
        Err(Error::ReplicaInUse {
            holder_pid, key: k, ..
        }) => assert_eq!((holder_pid, k.as_str()), (std::process::id(), key.as_str())),
        other => panic!("expected ReplicaInUse, got {other:?}"),
    }

    // Writer B takes the key over (as if A had hung past its TTL).
    let theirs = RouterValue {
        writer_pid: 999_999,
        heartbeat_period_us: 50_000,
        state: STATE_ACTIVE,
        generation: 42,
        heartbeat_seq: 1,
        heartbeat_mono_ns: 1,
        ttl_ms: 60_000,
        engines: vec![(id("e9"), counters(9))],
    }
    .encode();
    redis::cmd("SET")
        .arg(&key)
        .arg(&theirs[..])
        .arg("PX")
        .arg(60_000)
        .query::<()>(&mut con)
        .unwrap();
    let refused_before = sink_a.stats().refused.load(Ordering::Relaxed);
    for n in 1..=50 {
        sink_a.set("e0", &counters(n)).unwrap();
    }
    wait_for(
        || sink_a.stats().refused.load(Ordering::Relaxed) >= refused_before + 3,
        "refused writes (heartbeats and the change)",
    );
    assert_eq!(get(&mut con, &key).unwrap(), theirs, "B's value untouched");

    // B closes: A writes again within a heartbeat or so.
    redis::cmd("DEL").arg(&key).query::<()>(&mut con).unwrap();
    wait_for(
        || {
            value_at(&mut con, &key)
                .and_then(|v| counters_of(&v, "e0"))
                .is_some_and(|c| c == counters(50))
        },
        "A's value back after B's key went",
    );

    // B again; A's close leaves B's key (and registration) alone.
    redis::cmd("SET")
        .arg(&key)
        .arg(&theirs[..])
        .arg("PX")
        .arg(60_000)
        .query::<()>(&mut con)
        .unwrap();
    sink_a.close();
    assert_eq!(get(&mut con, &key).unwrap(), theirs);
    assert!(is_member(&mut con, &router_registry_key("own:"), "r0"));
}

#[test]
fn close_deletes_the_key_and_the_registration() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let mut sink = sink(
        &server,
        "?prefix=close:",
        "r0",
        ReplicaSinkOptions::default(),
    );
    sink.set("e0", &counters(1)).unwrap();
    assert!(sink.flush(Duration::from_secs(2)));
    let key = router_key("close:", "r0");
    assert!(get(&mut con, &key).is_some());
    sink.close();
    assert_eq!(get(&mut con, &key), None);
    assert!(!is_member(&mut con, &router_registry_key("close:"), "r0"));
    // Dropping a sink closes it too.
    let sink = self::sink(
        &server,
        "?prefix=close:",
        "r1",
        ReplicaSinkOptions::default(),
    );
    assert!(get(&mut con, &router_key("close:", "r1")).is_some());
    drop(sink);
    assert_eq!(get(&mut con, &router_key("close:", "r1")), None);
}

/// The child side of [`a_killed_writers_key_expires`]: a sink in its own
/// process, writing until killed.
#[test]
#[ignore = "run as a child process by a_killed_writers_key_expires"]
fn child_replica_writer() {
    let Ok(uri) = std::env::var("ES_TEST_REPLICA_URI") else {
        return;
    };
    let target = RedisTarget::parse(&uri).unwrap();
    let sink = ReplicaSink::start(target, &id("r-child"), ReplicaSinkOptions::default()).unwrap();
    sink.set("e0", &counters(5)).unwrap();
    assert!(sink.flush(Duration::from_secs(5)));
    println!("ready");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

/// A router killed with SIGKILL: its key expires `ttl_ms` after its last
/// write, and readers see the replica gone.
#[test]
fn a_killed_writers_key_expires() {
    let server = RedisServer::start();
    let uri = server.uri("?prefix=kill:&ttl_ms=400");
    let mut child = Proc::spawn(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "child_replica_writer",
                "--nocapture",
            ])
            .env("ES_TEST_REPLICA_URI", &uri)
            .stdout(Stdio::piped()),
    );
    let stdout = child.0.stdout.take().unwrap();
    let ready = std::io::BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|line| line.trim() == "ready");
    assert!(ready, "the child writer did not start");
    let mut con = server.connection();
    let key = router_key("kill:", "r-child");
    let mut replicas = RedisReplicas::open(RedisTarget::parse(&uri).unwrap()).unwrap();
    replicas.set_rescan_interval(Duration::ZERO);
    let reading = replicas.read(Instant::now()).unwrap();
    let (name, value) = &reading.replicas[0];
    assert_eq!(&**name, "r-child");
    let value = value.as_ref().unwrap();
    assert_eq!(counters_of(&value.value, "e0"), Some(counters(5)));
    assert!(
        value.heartbeat_age < Duration::from_millis(400),
        "{value:?}"
    );

    child.kill();
    let killed = Instant::now();
    wait_for_within(
        Duration::from_secs(5),
        || get(&mut con, &key).is_none(),
        "the killed writer's key to expire",
    );
    let expired_after = killed.elapsed();
    eprintln!("key expired {expired_after:?} after the kill (ttl_ms 400)");
    assert!(
        expired_after <= Duration::from_millis(400 + 300),
        "{expired_after:?}"
    );
    let reading = replicas.read(Instant::now()).unwrap();
    assert!(reading.replicas.is_empty(), "{:?}", reading.replicas);
    assert_eq!(reading.gone, [std::sync::Arc::<str>::from("r-child")]);
}

/// Next to a good replica, each malformed value is that replica's error,
/// registry members that are not ids one error, an id without a key counted.
#[test]
fn malformed_values_read_back_as_per_replica_errors() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let uri = server.uri("?prefix=bad:");
    let sink = sink(
        &server,
        "?prefix=bad:",
        "good",
        ReplicaSinkOptions::default(),
    );
    sink.set("e0", &counters(3)).unwrap();
    assert!(sink.flush(Duration::from_secs(2)));
    let good = RouterValue {
        state: STATE_ACTIVE,
        ttl_ms: 60_000,
        engines: vec![(id("e0"), counters(1)), (id("e1"), counters(2))],
        ..RouterValue::default()
    }
    .encode();
    let mut duplicate = good.clone();
    duplicate[64 + 128..64 + 128 + 2].copy_from_slice(b"e0");
    let mut version = good.clone();
    version[8] = 7;
    let cases: [(&str, Vec<u8>, Option<u64>, &str); 6] = [
        (
            "junk",
            b"hello".to_vec(),
            Some(60_000),
            "without the ESROUTER magic",
        ),
        (
            "dup",
            duplicate,
            Some(60_000),
            "engine e0 is in slots 0 and 1",
        ),
        ("version", version, Some(60_000), "layout version 7"),
        (
            "short",
            good[..100].to_vec(),
            Some(60_000),
            "100 bytes, but its count 2",
        ),
        ("persist", good.clone(), None, "no expiry"),
        (
            "huge",
            vec![b'x'; 40_000],
            Some(60_000),
            "larger than the largest router value",
        ),
    ];
    for (name, bytes, px, _) in &cases {
        let key = router_key("bad:", name);
        let mut set = redis::cmd("SET");
        set.arg(&key).arg(&bytes[..]);
        if let Some(px) = px {
            set.arg("PX").arg(*px);
        }
        set.query::<()>(&mut con).unwrap();
        redis::cmd("SADD")
            .arg(router_registry_key("bad:"))
            .arg(*name)
            .query::<()>(&mut con)
            .unwrap();
    }
    redis::cmd("SADD")
        .arg(router_registry_key("bad:"))
        .arg(&["not an id!", "never-written"][..])
        .query::<()>(&mut con)
        .unwrap();
    let mut replicas = RedisReplicas::open(RedisTarget::parse(&uri).unwrap()).unwrap();
    let reading = replicas.read(Instant::now()).unwrap();
    let found: Vec<&str> = reading.replicas.iter().map(|(id, _)| &**id).collect();
    assert_eq!(
        found,
        ["dup", "good", "huge", "junk", "persist", "short", "version"]
    );
    for (name, result) in &reading.replicas {
        if &**name == "good" {
            let value = result.as_ref().unwrap();
            assert_eq!(value.value.engines, [(id("e0"), counters(3))]);
            continue;
        }
        let says = cases.iter().find(|c| c.0 == &**name).unwrap().3;
        let error = result.as_ref().unwrap_err().to_string();
        assert!(
            error.contains(says) && error.contains(&router_key("bad:", name)),
            "{name}: {error}"
        );
    }
    assert_eq!(reading.unkeyed_members, 1);
    let invalid = reading.invalid_members.unwrap().to_string();
    assert!(
        invalid.contains("1 member(s) are not router replica ids"),
        "{invalid}"
    );
    assert!(reading.gone.is_empty());
}

/// A server restart: the sink reconnects with backoff, counts the failure,
/// and writes (and registers) again.
#[test]
fn the_sink_writes_again_after_a_server_restart() {
    let mut server = RedisServer::start();
    let options = ReplicaSinkOptions {
        heartbeat_period: Duration::from_millis(20),
        ..ReplicaSinkOptions::default()
    };
    let sink = sink(&server, "?prefix=re:", "r0", options);
    sink.set("e0", &counters(1)).unwrap();
    assert!(sink.flush(Duration::from_secs(2)));
    server.restart();
    let mut con = server.connection();
    wait_for(
        || {
            value_at(&mut con, &router_key("re:", "r0"))
                .is_some_and(|v| counters_of(&v, "e0") == Some(counters(1)))
        },
        "the value written again after the restart",
    );
    assert!(is_member(&mut con, &router_registry_key("re:"), "r0"));
    assert!(sink.stats().errors.load(Ordering::Relaxed) >= 1);
    let last_error = sink.stats().last_error();
    assert!(
        last_error.is_none(),
        "cleared by the success: {last_error:?}"
    );
}

/// The ACL REDIS.md advises for writers (`+eval`, not `+evalsha`) and a
/// flushed script cache: the sink writes all the same, through `EVAL`.
#[test]
fn a_user_granted_eval_alone_and_a_flushed_script_cache_still_write() {
    let server = RedisServer::start();
    let mut admin = server.connection();
    redis::cmd("ACL")
        .arg(
            &[
                "SETUSER", "rtr", "on", ">pw", "~*", "+ping", "+@read", "+@write", "+eval",
            ][..],
        )
        .query::<()>(&mut admin)
        .unwrap();
    let uri = format!("redis://rtr:pw@127.0.0.1:{}/0?prefix=acl:", server.port());
    let sink = ReplicaSink::start(
        RedisTarget::parse(&uri).unwrap(),
        &id("r0"),
        ReplicaSinkOptions::default(),
    )
    .unwrap();
    let mut full = self::sink(&server, "?prefix=acl:", "r1", ReplicaSinkOptions::default());
    for n in 1..=3 {
        redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query::<()>(&mut admin)
            .unwrap();
        sink.set("e0", &counters(n)).unwrap();
        full.set("e0", &counters(n)).unwrap();
        assert!(sink.flush(Duration::from_secs(2)) && full.flush(Duration::from_secs(2)));
        for replica in ["r0", "r1"] {
            let value = value_at(&mut admin, &router_key("acl:", replica)).unwrap();
            assert_eq!(counters_of(&value, "e0"), Some(counters(n)), "{replica}");
        }
    }
    assert_eq!(sink.stats().errors.load(Ordering::Relaxed), 0);
    assert_eq!(full.stats().errors.load(Ordering::Relaxed), 0);
    full.close();
}

/// A wrong password is an error at start that does not show the password.
#[test]
fn a_wrong_password_is_an_error_without_the_password() {
    let server = RedisServer::start_with(Some("right-pw"));
    let uri = format!(
        "redis://:s3cret-wrong@127.0.0.1:{}/0?prefix=pw:",
        server.port()
    );
    let error = ReplicaSink::start(
        RedisTarget::parse(&uri).unwrap(),
        &id("r0"),
        ReplicaSinkOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("check the user and password"), "{error}");
    assert!(!error.contains("s3cret-wrong"), "{error}");
}

/// A value rewritten with the same heartbeat (by hand: no live writer does
/// that) ages on the reader's clock instead of reading as new; a replica
/// whose key is gone is pruned from the registry after `PRUNE_AFTER`.
#[test]
fn a_rewritten_heartbeat_ages_and_a_gone_replica_is_pruned() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let uri = server.uri("?prefix=age:");
    let key = router_key("age:", "r0");
    let value = RouterValue {
        state: STATE_ACTIVE,
        ttl_ms: 10_000,
        heartbeat_seq: 7,
        engines: vec![(id("e0"), counters(1))],
        ..RouterValue::default()
    }
    .encode();
    let set = |con: &mut redis::Connection| {
        redis::cmd("SET")
            .arg(&key)
            .arg(&value[..])
            .arg("PX")
            .arg(10_000)
            .query::<()>(con)
            .unwrap();
    };
    set(&mut con);
    redis::cmd("SADD")
        .arg(router_registry_key("age:"))
        .arg("r0")
        .query::<()>(&mut con)
        .unwrap();
    let mut replicas = RedisReplicas::open(RedisTarget::parse(&uri).unwrap()).unwrap();
    replicas.set_prune_after(Duration::ZERO);
    replicas.set_rescan_interval(Duration::ZERO);
    let first = Instant::now();
    let age = |reading: &engine_state_redis::ReplicaReading| {
        reading.replicas[0].1.as_ref().unwrap().heartbeat_age
    };
    assert!(age(&replicas.read(first).unwrap()) < Duration::from_millis(100));
    set(&mut con);
    let later = first + Duration::from_secs(3);
    let aged = age(&replicas.read(later).unwrap());
    assert!(aged >= Duration::from_secs(3), "{aged:?}");

    redis::cmd("DEL").arg(&key).query::<()>(&mut con).unwrap();
    let reading = replicas.read(Instant::now()).unwrap();
    assert_eq!(reading.gone, [std::sync::Arc::<str>::from("r0")]);
    // Missing for PRUNE_AFTER (zero here): the next read SREMs it.
    replicas.read(Instant::now()).unwrap();
    wait_for(
        || !is_member(&mut con, &router_registry_key("age:"), "r0"),
        "the gone replica pruned",
    );
    let reading = replicas.read(Instant::now()).unwrap();
    assert!(reading.gone.is_empty() && reading.replicas.is_empty());
}

/// 20 000 junk members in the replica registry (half not replica ids, half
/// valid ids without a key): every read lists exactly the two real
/// replicas, and a read stays cheap (the registry is scanned a step per
/// read, as the engines').
#[test]
fn a_registry_flood_costs_a_read_little() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let registry = router_registry_key("flood:");
    for chunk in 0..20 {
        let members: Vec<String> = (0..1000)
            .map(|i| {
                let n = chunk * 1000 + i;
                if n % 2 == 0 {
                    format!("bad id {n}")
                } else {
                    format!("junk-{n}")
                }
            })
            .collect();
        redis::cmd("SADD")
            .arg(&registry)
            .arg(&members)
            .query::<()>(&mut con)
            .unwrap();
    }
    let sinks: Vec<ReplicaSink> = ["r0", "r1"]
        .iter()
        .map(|r| sink(&server, "?prefix=flood:", r, ReplicaSinkOptions::default()))
        .collect();
    for sink in &sinks {
        sink.set("e0", &counters(1)).unwrap();
        assert!(sink.flush(Duration::from_secs(2)));
    }
    let mut replicas =
        RedisReplicas::open(RedisTarget::parse(&server.uri("?prefix=flood:")).unwrap()).unwrap();
    replicas.set_rescan_interval(Duration::ZERO);
    let mut times = Vec::new();
    let mut last = None;
    // Past one whole scan (20 steps of 1000), so every member was seen.
    for _ in 0..60 {
        let started = Instant::now();
        let reading = replicas.read(started).unwrap();
        times.push(started.elapsed());
        let ids: Vec<&str> = reading.replicas.iter().map(|(id, _)| &**id).collect();
        // A real replica is listed once the scan reached it.
        assert!(ids.iter().all(|id| ["r0", "r1"].contains(id)), "{ids:?}");
        assert!(reading.replicas.iter().all(|(_, v)| v.is_ok()));
        last = Some(reading);
    }
    let last = last.unwrap();
    let ids: Vec<&str> = last.replicas.iter().map(|(id, _)| &**id).collect();
    assert_eq!(ids, ["r0", "r1"]);
    assert_eq!(last.unkeyed_members, 10_000);
    let invalid = last.invalid_members.unwrap().to_string();
    assert!(invalid.contains("10000 member(s)"), "{invalid}");
    times.sort();
    let p99 = times[times.len() * 99 / 100];
    eprintln!(
        "reads under a flood: p50 {:?}, p99 {p99:?}",
        times[times.len() / 2]
    );
    assert!(p99 < Duration::from_millis(100), "p99 {p99:?}");
}
