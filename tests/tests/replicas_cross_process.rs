//! Four router replicas in four processes sharing their reservations
//! (docs/ROUTING.md, "Shared reservations"), on shared memory and through a
//! real redis-server: each sees the others' reservations within the bound
//! (shared memory: at its next read; Redis: the sink's 5 ms flush plus a
//! round trip, asserted ≤ 1 s on a busy host), all return to zero when they
//! complete, a killed replica's vanish within the liveness bound, and bad
//! records are per-replica errors.

use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use engine_state_shm_format::routers_dir;
use engine_state_tests::{bin, wait_for, wait_for_within, Proc, RedisServer};
use serde_json::Value;

const ENGINES: &str = "e0,e1,e2,e3,e4,e5,e6,e7";

/// One `esreplica` process and its stdout.
struct Replica {
    proc: Proc,
    out: BufReader<ChildStdout>,
}

impl Replica {
    fn start(uri: &str, id: &str) -> Replica {
        let mut proc = Proc::spawn(
            Command::new(bin("esreplica"))
                .args(["--uri", uri, "--replica-id", id, "--engines", ENGINES])
                .stdout(Stdio::piped()),
        );
        let out = BufReader::new(proc.0.stdout.take().unwrap());
        let mut replica = Replica { proc, out };
        assert_eq!(replica.answer()["ready"], true);
        replica
    }

    fn answer(&mut self) -> Value {
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }

    fn ask(&mut self, command: &str) -> Value {
        let stdin = self.proc.0.stdin.as_mut().unwrap();
        writeln!(stdin, "{command}").unwrap();
        stdin.flush().unwrap();
        self.answer()
    }
}

/// Σ over `views`' own requests per engine, leaving out replica `skip`.
fn others_own(views: &[Value], skip: usize) -> Vec<u64> {
    (0..8)
        .map(|e| {
            views
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != skip)
                .map(|(_, v)| v["own"][format!("e{e}")].as_u64().unwrap())
                .sum()
        })
        .collect()
}

fn peers(view: &Value) -> Vec<u64> {
    (0..8)
        .map(|e| view["peers"][format!("e{e}")].as_u64().unwrap())
        .collect()
}

fn fresh_peers(view: &Value) -> usize {
    view["replicas"]
        .as_object()
        .unwrap()
        .values()
        .filter(|s| *s == "fresh")
        .count()
}

/// How a backend makes a change visible to the peers.
#[derive(Clone, Copy, PartialEq)]
enum Visible {
    /// At the peer's next read (a seqlock write is done before `pick` returns).
    NextRead,
    /// Within this bound (the Redis sink's flush and a round trip).
    Within(Duration),
}

/// Asks every replica for its view until `check` holds for all of them
/// (at once for [`Visible::NextRead`]); returns the views.
fn views_when(
    replicas: &mut [Replica],
    visible: Visible,
    what: &str,
    check: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let mut views: Vec<Value> = replicas.iter_mut().map(|r| r.ask("view")).collect();
    if let Visible::Within(bound) = visible {
        let start = Instant::now();
        while !check(&views) {
            assert!(
                start.elapsed() < bound,
                "{what} not visible within {bound:?}: {views:?}"
            );
            views = replicas.iter_mut().map(|r| r.ask("view")).collect();
        }
        eprintln!("{what}: visible after {:?}", start.elapsed());
    }
    assert!(check(&views), "{what}: {views:?}");
    views
}

fn consistent(views: &[Value], total: u64) -> bool {
    views.iter().enumerate().all(|(i, view)| {
        let own: u64 = view["own"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum();
        peers(view) == others_own(views, i) && peers(view).iter().sum::<u64>() + own == total
    })
}

#[test]
fn four_replicas_see_each_others_reservations_on_shared_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let uri = format!("file://{}", dir.display());
    four_replicas_share(&uri, Visible::NextRead, Duration::from_secs(4));
}

#[test]
fn four_replicas_see_each_others_reservations_through_redis() {
    let redis = RedisServer::start();
    let uri = redis.uri("?prefix=share:");
    // A killed replica's key expires 2 s (stale_after) after its last write.
    four_replicas_share(
        &uri,
        Visible::Within(Duration::from_secs(1)),
        Duration::from_secs(5),
    );
}

fn four_replicas_share(uri: &str, visible: Visible, liveness: Duration) {
    let mut replicas: Vec<Replica> = (0..4)
        .map(|i| Replica::start(uri, &format!("router-{i}")))
        .collect();
    // Each lists the others within a few listings (every 20 ms).
    for replica in &mut replicas {
        wait_for(
            || fresh_peers(&replica.ask("view")) == 3,
            "every peer listed",
        );
    }

    // Every replica holds requests; the others see them within the bound
    // (on shared memory at their next read: a seqlock write is done before
    // `pick` returns).
    for (i, replica) in replicas.iter_mut().enumerate() {
        let held = replica.ask(&format!("pick {} {}", 3 + i, 600 + 500 * i));
        assert_eq!(held["held"], 3 + i as u64);
    }
    let total: u64 = (0..4).map(|i| 3 + i as u64).sum();
    let views = views_when(&mut replicas, visible, "every reservation", |views| {
        consistent(views, total)
    });
    for view in &views {
        assert!(view["errors"].as_array().unwrap().is_empty(), "{view}");
    }
    // `esdump --replicas` shows the same, from outside every router.
    let dump = Command::new(bin("esdump"))
        .args(["--uri", uri, "--replicas", "--json"])
        .output()
        .unwrap();
    assert!(
        dump.status.success(),
        "{}",
        String::from_utf8_lossy(&dump.stderr)
    );
    let listed: Value = serde_json::from_slice(&dump.stdout).unwrap();
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 4, "{listed:?}");
    let dumped: u64 = listed
        .iter()
        .flat_map(|r| r["engines"].as_object().unwrap().values())
        .map(|e| e["num_requests"].as_u64().unwrap())
        .sum();
    assert_eq!(dumped, total);
    let table = Command::new(bin("esdump"))
        .args(["--uri", uri, "--replicas"])
        .output()
        .unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(
        table.starts_with("REPLICA") && table.contains("router-3"),
        "{table}"
    );

    // Picks spread over the fleet as one router's would: with 18 requests
    // on 8 engines no engine holds more than 3 (LoadOnly over the sum; each
    // replica read its peers just before its picks, all visible by then
    // on shared memory, and on Redis once the previous replica's write
    // went out, which the batch of picks rarely outruns: 4 allowed there).
    let most = if visible == Visible::NextRead { 3 } else { 4 };
    let fleet: Vec<u64> = (0..8)
        .map(|e| {
            views
                .iter()
                .map(|v| v["own"][format!("e{e}")].as_u64().unwrap())
                .sum()
        })
        .collect();
    assert!(fleet.iter().all(|&n| n <= most), "fleet load {fleet:?}");

    // prefill_done and completions are published too: back to zero.
    for replica in &mut replicas {
        replica.ask("prefill");
        assert_eq!(replica.ask("complete")["held"], 0);
    }
    views_when(&mut replicas, visible, "every completion", |views| {
        views.iter().all(|view| peers(view) == vec![0; 8])
    });

    // A killed replica's reservations vanish within the liveness bound:
    // the readers see its process gone (same pid namespace) at their next
    // listing, and at worst its heartbeat goes stale after 2 s.
    assert_eq!(replicas[3].ask("pick 5 1000")["held"], 5);
    views_when(
        &mut replicas[..1],
        visible,
        "the doomed replica's picks",
        |views| peers(&views[0]).iter().sum::<u64>() == 5,
    );
    let killed = Instant::now();
    replicas[3].proc.kill();
    for replica in &mut replicas[..3] {
        wait_for_within(
            liveness,
            || peers(&replica.ask("view")).iter().sum::<u64>() == 0,
            "the killed replica's reservations to drop out",
        );
    }
    eprintln!("killed replica dropped out after {:?}", killed.elapsed());
}

#[test]
fn bad_records_are_per_replica_errors_and_the_good_ones_still_count() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let uri = format!("file://{}", dir.display());
    let mut a = Replica::start(&uri, "router-a");
    let mut b = Replica::start(&uri, "router-b");
    wait_for(|| fresh_peers(&a.ask("view")) == 1, "b listed by a");
    let routers = routers_dir(&dir);
    // Junk, a copy of b's file under another name (it names b inside), a
    // file whose counters claim 2^64-1 requests in a torn state, a FIFO.
    std::fs::write(routers.join("junk"), vec![0x5a; 40_000]).unwrap();
    std::fs::copy(routers.join("router-b"), routers.join("router-c")).unwrap();
    nix::unistd::mkfifo(&routers.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let mut forged = std::fs::read(routers.join("router-b")).unwrap();
    forged[80..88].copy_from_slice(&1_000_000u64.to_le_bytes()); // count > capacity
    let forged_path = routers.join("forged");
    forged[128..134].copy_from_slice(b"forged");
    forged[134..192].fill(0);
    std::fs::write(&forged_path, &forged).unwrap();

    assert_eq!(b.ask("pick 2 800")["held"], 2);
    wait_for(
        || a.ask("view")["errors"].as_array().unwrap().len() == 4,
        "the four bad entries reported",
    );
    let view = a.ask("view");
    let errors: Vec<&str> = view["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert_eq!(errors, ["fifo", "forged", "junk", "router-c"], "{view}");
    assert_eq!(
        peers(&view).iter().sum::<u64>(),
        2,
        "b still counts: {view}"
    );
    assert_eq!(fresh_peers(&view), 1);
}
