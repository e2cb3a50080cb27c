//! One reader suite, two backends: every test body runs against the
//! shared-memory source and the Redis source through the same `Source` trait
//! (`open(uri)`), with the same publisher API on the writing side.

use std::process::{Command, Stdio};
use std::time::Duration;

use engine_state_publisher::{Publisher, PublisherConfig};
use engine_state_reader::{open, ReaderOptions, Source, StateUri, Status};
use engine_state_redis::{engine_key, registry_key, RedisRecord, DEFAULT_PREFIX};
use engine_state_shm_format::Snapshot;
use engine_state_tests::*;

/// A place engines publish into, plus ways to put bad entries next to them.
trait Backend {
    /// The URI publishers and readers use.
    fn uri(&self) -> String;
    /// Puts an entry named `name` that is not engine state at all.
    fn put_foreign(&self, name: &str);
    /// Puts an entry named `name` that is engine state of layout version 9.
    fn put_other_version(&self, name: &str);
}

struct Shm(tempfile::TempDir);

impl Backend for Shm {
    fn uri(&self) -> String {
        format!("file://{}", self.0.path().display())
    }
    fn put_foreign(&self, name: &str) {
        std::fs::write(self.0.path().join(name), b"hello").unwrap();
    }
    fn put_other_version(&self, name: &str) {
        let publisher = publisher(self, name, 50);
        let mut bytes = std::fs::read(publisher.path().unwrap()).unwrap();
        drop(publisher);
        bytes[8] = 9;
        std::fs::write(self.0.path().join(name), bytes).unwrap();
    }
}

struct Redis(RedisServer);

impl Backend for Redis {
    fn uri(&self) -> String {
        // A short TTL so that a killed writer expires quickly.
        self.0.uri("?ttl_ms=400")
    }
    fn put_foreign(&self, name: &str) {
        let mut con = self.0.connection();
        let _: () = redis::pipe()
            .set(engine_key(DEFAULT_PREFIX, name), "hello")
            .sadd(registry_key(DEFAULT_PREFIX), name)
            .query(&mut con)
            .unwrap();
    }
    fn put_other_version(&self, name: &str) {
        let mut bytes = RedisRecord::default().encode();
        bytes[8] = 9;
        let mut con = self.0.connection();
        let _: () = redis::pipe()
            .set(engine_key(DEFAULT_PREFIX, name), &bytes[..])
            .sadd(registry_key(DEFAULT_PREFIX), name)
            .query(&mut con)
            .unwrap();
    }
}

/// Runs `body` against both backends.
macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod shm {
            $(#[test] fn $name() { super::$name(&super::Shm(tempfile::tempdir().unwrap())) })*
        }
        mod redis_source {
            $(#[test] fn $name() { super::$name(&super::Redis(engine_state_tests::RedisServer::start())) })*
        }
    };
}

conformance!(
    reads_every_engine_sorted_with_values_and_ages,
    notices_new_and_removed_engines,
    sees_every_update,
    heartbeat_keeps_an_idle_engine_fresh,
    stale_threshold_is_a_reader_setting,
    bad_entries_are_per_engine_errors_and_healthy_engines_still_read,
    a_killed_writer_turns_dead,
    esdump_json_shows_the_same_engines,
    esdump_table_filters_sorts_and_totals_while_watching,
    open_dispatches_on_the_uri_and_hides_nothing_but_passwords,
    a_second_live_publisher_of_an_id_is_refused_and_a_restarted_one_takes_over,
);

fn publisher(backend: &impl Backend, id: &str, period_ms: u64) -> Publisher {
    let config =
        PublisherConfig::resolve(Some(&backend.uri()), Some(id), Some(period_ms), None).unwrap();
    Publisher::start(config).unwrap()
}

fn reader(backend: &impl Backend, stale_after: Duration) -> Box<dyn Source> {
    test_reader(&backend.uri(), stale_after)
}

fn running(n: u64) -> Snapshot {
    Snapshot {
        num_running: n,
        ..Snapshot::default()
    }
}

fn reads_every_engine_sorted_with_values_and_ages(backend: &impl Backend) {
    let mut b = publisher(backend, "b", 50);
    let mut a = publisher(backend, "a", 50);
    b.publish(running(2)).unwrap();
    a.publish(Snapshot {
        gpu_blocks_total: 100,
        gpu_blocks_free: 25,
        ..running(1)
    })
    .unwrap();
    let mut source = reader(backend, Duration::from_secs(2));
    wait_for(
        || {
            let r = source.read().unwrap();
            r.engines.len() == 2 && r.engines.iter().all(|e| e.snapshot.num_running > 0)
        },
        "both engines",
    );
    let reading = source.read().unwrap();
    let ids: Vec<&str> = reading.engines.iter().map(|e| &*e.engine_id).collect();
    assert_eq!(ids, ["a", "b"]);
    assert!(reading.errors.is_empty(), "{:?}", reading.errors);
    let state = reading.get("a").unwrap();
    assert_eq!(state.status, Status::Fresh);
    assert_eq!(state.snapshot.num_running, 1);
    assert_eq!(state.gpu_kv_used_frac(), Some(0.75));
    assert!(state.heartbeat_age < Duration::from_secs(1), "{state:?}");
    assert!(state.capture_age < Duration::from_secs(1), "{state:?}");
    assert_ne!(state.generation, 0);
    assert_eq!(reading.get("b").unwrap().snapshot.num_running, 2);
}

fn notices_new_and_removed_engines(backend: &impl Backend) {
    let _other = publisher(backend, "other", 50);
    let mut source = reader(backend, Duration::from_secs(2));
    wait_for(|| source.read().unwrap().engines.len() == 1, "one engine");
    let mut e = publisher(backend, "e", 50);
    wait_for(
        || source.read().unwrap().get("e").is_some(),
        "the new engine",
    );
    e.close();
    wait_for(
        || source.read().unwrap().get("e").is_none(),
        "the closed engine to go away",
    );
    assert!(source.read().unwrap().get("other").is_some());
}

fn sees_every_update(backend: &impl Backend) {
    let mut p = publisher(backend, "u", 50);
    let mut source = reader(backend, Duration::from_secs(2));
    for step in 1..=20u64 {
        p.publish(Snapshot {
            step,
            num_waiting: step * 10,
            ..Snapshot::default()
        })
        .unwrap();
        wait_for_engine(&mut *source, "u", "the latest snapshot", |s| {
            s.snapshot.step == step && s.snapshot.num_waiting == step * 10
        });
    }
}

fn heartbeat_keeps_an_idle_engine_fresh(backend: &impl Backend) {
    let _p = publisher(backend, "hb", 10);
    let mut source = reader(backend, Duration::from_millis(150));
    // Idle for 400 ms is the premise (the publisher runs on real time in
    // another process, so time passes here too): the capture must age
    // while heartbeats keep coming, and no event marks "400 ms idle".
    std::thread::sleep(Duration::from_millis(400));
    let reading = source.read().unwrap();
    let state = reading.get("hb").unwrap();
    assert_eq!(state.status, Status::Fresh, "{state:?}");
    assert!(
        state.heartbeat_age < Duration::from_millis(150),
        "{state:?}"
    );
    // Redis estimates ages from the server's TTL and its own clock, so allow
    // some slack below the 400 ms slept: the capture is old, heartbeats are not.
    assert!(
        state.capture_age >= Duration::from_millis(350),
        "no capture since start, only heartbeats: {state:?}"
    );
    assert!(state.snapshot.is_idle());
}

fn stale_threshold_is_a_reader_setting(backend: &impl Backend) {
    let mut p = publisher(backend, "slow", 1000);
    p.publish(running(1)).unwrap();
    let mut source = reader(backend, Duration::from_millis(50));
    wait_for_engine(&mut *source, "slow", "fresh right after a publish", |s| {
        s.status == Status::Fresh && s.snapshot.num_running == 1
    });
    // Until the 50 ms threshold is well past (polled, not slept); the
    // reading the wait ended on (a read after it could see a new stamp).
    let state = wait_for_engine(&mut *source, "slow", "a heartbeat 150 ms old", |s| {
        s.heartbeat_age >= Duration::from_millis(150)
    });
    assert_eq!(state.status, Status::Stale, "{state:?}");
    assert!(
        state.heartbeat_age >= Duration::from_millis(100),
        "{state:?}"
    );
}

fn bad_entries_are_per_engine_errors_and_healthy_engines_still_read(backend: &impl Backend) {
    let mut good = publisher(backend, "good", 50);
    good.publish(running(3)).unwrap();
    backend.put_foreign("junk");
    backend.put_other_version("future");
    let mut source = reader(backend, Duration::from_secs(2));
    wait_for_engine(&mut *source, "good", "the healthy engine", |s| {
        s.snapshot.num_running == 3
    });
    let reading = source.read().unwrap();
    assert_eq!(reading.engines.len(), 1, "{:?}", reading.engines);
    let mut names: Vec<&str> = reading.errors.iter().map(|e| e.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["future", "junk"]);
    for error in &reading.errors {
        let text = error.to_string();
        assert!(text.contains(&error.name), "{text}");
        if error.name == "future" {
            assert!(
                text.contains("layout version 9, but this build reads version 1"),
                "{text}"
            );
        } else {
            assert!(
                text.contains("remove it") || text.contains("delete it"),
                "{text}"
            );
        }
    }
}

fn a_killed_writer_turns_dead(backend: &impl Backend) {
    let mut writer = Proc::spawn(
        Command::new(bin("espublish"))
            .args(["--uri", &backend.uri(), "--engine-id", "doomed"])
            .args(["--period-ms", "20", "--set", "num_running=7"])
            .stdout(Stdio::piped()),
    );
    let line = writer.first_line();
    assert!(line.contains("publishing doomed"), "{line}");
    let mut source = reader(backend, Duration::from_millis(200));
    wait_for_engine(&mut *source, "doomed", "the writer to be fresh", |s| {
        s.status == Status::Fresh && s.snapshot.num_running == 7
    });
    writer.kill();
    wait_for_engine(
        &mut *source,
        "doomed",
        "the killed writer to turn dead",
        |s| s.status == Status::Dead,
    );
    let reading = source.read().unwrap();
    assert_eq!(
        reading.get("doomed").unwrap().snapshot.num_running,
        7,
        "the last snapshot stays visible"
    );
}

fn esdump_json_shows_the_same_engines(backend: &impl Backend) {
    let mut x = publisher(backend, "x", 50);
    let mut y = publisher(backend, "y", 50);
    x.publish(running(4)).unwrap();
    y.publish(running(5)).unwrap();
    let mut source = reader(backend, Duration::from_secs(2));
    wait_for(
        || {
            source
                .read()
                .unwrap()
                .engines
                .iter()
                .filter(|e| e.snapshot.num_running > 0)
                .count()
                == 2
        },
        "both engines",
    );
    let (value, _) = esdump_json(&backend.uri());
    let engines = value.as_array().unwrap();
    let got: Vec<(&str, u64, &str)> = engines
        .iter()
        .map(|e| {
            (
                e["engine_id"].as_str().unwrap(),
                e["num_running"].as_u64().unwrap(),
                e["status"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, [("x", 4, "fresh"), ("y", 5, "fresh")]);
    let mut keys: Vec<&str> = engines[0]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut expected = engine_state_reader::JSON_KEYS.to_vec();
    keys.sort_unstable();
    expected.sort_unstable();
    assert_eq!(keys, expected);
}

/// `esdump --watch --filter --sort` in another process: each frame shows the
/// engines with the prefix, the busiest first, and their totals.
fn esdump_table_filters_sorts_and_totals_while_watching(backend: &impl Backend) {
    let publishers: Vec<Publisher> = [("pool-a", 3), ("pool-b", 9), ("other", 50)]
        .into_iter()
        .map(|(id, running_requests)| {
            let mut p = publisher(backend, id, 50);
            p.publish(running(running_requests)).unwrap();
            p
        })
        .collect();
    let mut source = reader(backend, Duration::from_secs(2));
    wait_for(
        || {
            source
                .read()
                .unwrap()
                .engines
                .iter()
                .filter(|e| e.snapshot.num_running > 0)
                .count()
                == 3
        },
        "three engines",
    );
    let out = Command::new(bin("esdump"))
        .args(["--uri", &backend.uri(), "--watch", "--interval", "10"])
        .args(["--count", "2", "--filter", "pool-", "--sort", "run"])
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let frames: Vec<&str> = stdout.split("\x1b[2J").skip(1).collect();
    assert_eq!(frames.len(), 2, "{stdout}");
    for frame in frames {
        let rows: Vec<Vec<&str>> = frame
            .lines()
            .skip_while(|l| !l.starts_with("ENGINE "))
            // The next frame's cursor-home code ends this one.
            .filter(|l| !l.starts_with('\x1b'))
            .map(|l| l.split_whitespace().collect())
            .collect();
        let header = &rows[0];
        let run = header.iter().position(|h| *h == "RUN").unwrap();
        let got: Vec<(&str, &str)> = rows[1..].iter().map(|r| (r[0], r[run])).collect();
        // `TOTAL (2)` is two words and its STATUS blank: RUN lines up.
        assert_eq!(
            got,
            [("pool-b", "9"), ("pool-a", "3"), ("TOTAL", "12")],
            "{frame}"
        );
        assert_eq!(rows[3][1], "(2)", "{frame}");
        assert!(!frame.contains("MONO_NS"), "{frame}");
    }
    drop(publishers);
}

fn open_dispatches_on_the_uri_and_hides_nothing_but_passwords(backend: &impl Backend) {
    let uri = StateUri::parse(&backend.uri()).unwrap();
    let source = open(&uri, ReaderOptions::default()).unwrap();
    assert_eq!(source.uri(), uri.to_string());
    assert!(source.uri().starts_with(&backend.uri()[..7]));
}

fn a_second_live_publisher_of_an_id_is_refused_and_a_restarted_one_takes_over(
    backend: &impl Backend,
) {
    let start = |id: &str| {
        Publisher::start(
            PublisherConfig::resolve(Some(&backend.uri()), Some(id), Some(20), None).unwrap(),
        )
    };
    let refused = |id: &str| {
        let error = start(id).expect_err("a second live publisher must be refused");
        assert!(
            matches!(&error, engine_state_publisher::Error::AlreadyPublished { engine_id, .. }
                if engine_id == id),
            "{error:?}"
        );
        let text = error.to_string();
        assert!(
            text.contains("already published by a live process")
                && text.contains("AGENTIC_WORKER_ID"),
            "{text}"
        );
    };

    // In one process: the first stays the only writer, readers see only it.
    let mut first = start("dup-0").unwrap();
    first.publish(running(1)).unwrap();
    let mut source = reader(backend, Duration::from_secs(2));
    wait_for_engine(&mut *source, "dup-0", "the first publisher", |s| {
        s.snapshot.num_running == 1
    });
    let generation = source.read().unwrap().get("dup-0").unwrap().generation;
    refused("dup-0");
    for _ in 0..20 {
        first.publish(running(1)).unwrap();
        let reading = source.read().unwrap();
        let state = reading.get("dup-0").unwrap();
        assert_eq!(
            (state.generation, state.snapshot.num_running, state.status),
            (generation, 1, Status::Fresh),
            "readers see the first publisher only"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // A clean close frees the id at once.
    first.close();
    let mut next = start("dup-0").expect("the id is free after close()");
    next.publish(running(2)).unwrap();
    wait_for_engine(&mut *source, "dup-0", "the next publisher", |s| {
        s.snapshot.num_running == 2
    });

    // Across processes: refused while the other process lives; once it is
    // killed, a restarted engine takes the id over (shared memory: at once,
    // the lock died with it; Redis: once its key expired, ttl_ms = 400 here).
    let mut writer = Proc::spawn(
        Command::new(bin("espublish"))
            .args(["--uri", &backend.uri(), "--engine-id", "dup-1"])
            .args(["--period-ms", "20", "--set", "num_running=7"])
            .stdout(Stdio::piped()),
    );
    assert!(writer.first_line().contains("publishing dup-1"));
    wait_for_engine(&mut *source, "dup-1", "the other process", |s| {
        s.snapshot.num_running == 7
    });
    refused("dup-1");
    writer.kill();
    let mut restarted = None;
    wait_for(
        || {
            restarted = start("dup-1").ok();
            restarted.is_some()
        },
        "a restarted engine to take the id over",
    );
    let mut restarted = restarted.unwrap();
    restarted.publish(running(8)).unwrap();
    wait_for_engine(&mut *source, "dup-1", "the restarted engine", |s| {
        s.snapshot.num_running == 8 && s.status == Status::Fresh
    });
}
