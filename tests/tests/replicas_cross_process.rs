//! Four router replicas in four processes sharing their reservations on
//! shared memory (docs/ROUTING.md, "Shared reservations"): each sees the
//! others' reservations at its next read, all return to zero when they
//! complete, a killed replica's vanish within the liveness bound, and bad
//! records in the routers' directory are per-replica errors.

use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use engine_state_shm_format::routers_dir;
use engine_state_tests::{bin, wait_for, wait_for_within, Proc};
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

#[test]
fn four_replicas_see_each_others_reservations_on_shared_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let uri = format!("file://{}", dir.display());
    let mut replicas: Vec<Replica> = (0..4)
        .map(|i| Replica::start(&uri, &format!("router-{i}")))
        .collect();
    // Each lists the others within a few listings (every 20 ms).
    for replica in &mut replicas {
        wait_for(
            || fresh_peers(&replica.ask("view")) == 3,
            "every peer listed",
        );
    }

    // Every replica holds requests; each one's next read shows the others'
    // exactly (a seqlock write is done before `pick` returns).
    for (i, replica) in replicas.iter_mut().enumerate() {
        let held = replica.ask(&format!("pick {} {}", 3 + i, 600 + 500 * i));
        assert_eq!(held["held"], 3 + i as u64);
    }
    let views: Vec<Value> = replicas.iter_mut().map(|r| r.ask("view")).collect();
    let total: u64 = (0..4).map(|i| 3 + i as u64).sum();
    for (i, view) in views.iter().enumerate() {
        assert_eq!(peers(view), others_own(&views, i), "replica {i}: {view}");
        let own: u64 = view["own"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum();
        assert_eq!(peers(view).iter().sum::<u64>() + own, total);
        assert!(view["errors"].as_array().unwrap().is_empty(), "{view}");
    }
    // `esdump --replicas` shows the same, from outside every router.
    let dump = Command::new(bin("esdump"))
        .args(["--uri", &uri, "--replicas", "--json"])
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
        .args(["--uri", &uri, "--replicas"])
        .output()
        .unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(
        table.starts_with("REPLICA") && table.contains("router-3"),
        "{table}"
    );

    // Picks spread over the fleet as one router's would: with 18 requests
    // on 8 engines no engine holds more than 3 (LoadOnly over the sum).
    let fleet: Vec<u64> = (0..8)
        .map(|e| {
            views
                .iter()
                .map(|v| v["own"][format!("e{e}")].as_u64().unwrap())
                .sum()
        })
        .collect();
    assert!(fleet.iter().all(|&n| n <= 3), "fleet load {fleet:?}");

    // prefill_done and completions are published too: back to zero.
    for replica in &mut replicas {
        replica.ask("prefill");
        assert_eq!(replica.ask("complete")["held"], 0);
    }
    for (i, replica) in replicas.iter_mut().enumerate() {
        let view = replica.ask("view");
        assert_eq!(peers(&view), vec![0; 8], "replica {i}: {view}");
    }

    // A killed replica's reservations vanish within the liveness bound:
    // the readers see its process gone (same pid namespace) at their next
    // listing, and at worst its heartbeat goes stale after 2 s.
    assert_eq!(replicas[3].ask("pick 5 1000")["held"], 5);
    assert_eq!(peers(&replicas[0].ask("view")).iter().sum::<u64>(), 5);
    let killed = Instant::now();
    replicas[3].proc.kill();
    for replica in &mut replicas[..3] {
        wait_for_within(
            Duration::from_secs(4),
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
