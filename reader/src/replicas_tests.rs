//! The shared-memory replicas source: live records, the own one left out,
//! dead and malformed replicas.

use std::time::Duration;

use engine_state_shm_format::{
    routers_dir, EngineId, Reservations, RouterFileWriter, RouterWriterOptions,
};

use super::*;
use crate::freshness::Freshness;

fn options() -> ReaderOptions {
    ReaderOptions {
        freshness: Freshness {
            stale_after: Duration::from_secs(2),
            ..Freshness::default()
        },
        // Every read lists: the tests add and remove files between reads.
        rescan_interval: Duration::ZERO,
        cache_digests: false,
    }
}

fn writer(dir: &std::path::Path, id: &str) -> RouterFileWriter {
    std::fs::create_dir_all(dir).unwrap();
    let w = RouterFileWriter::create(
        dir,
        &EngineId::new(id).unwrap(),
        &RouterWriterOptions::default(),
    )
    .unwrap();
    assert!(w.heartbeat().beat());
    w
}

fn reserved(n: u64) -> Reservations {
    Reservations {
        num_requests: n,
        ongoing_tokens: 100 * n,
        ..Reservations::default()
    }
}

#[test]
fn every_replica_but_the_own_one_is_read_fresh() {
    let state_dir = tempfile::tempdir().unwrap();
    let dir = state_dir.path().join("state");
    let mut a = writer(&dir, "router-a");
    let mut b = writer(&dir, "router-b");
    let _own = writer(&dir, "router-me");
    a.set("e0", &reserved(2)).unwrap();
    a.set("e1", &reserved(1)).unwrap();
    b.set("e1", &reserved(5)).unwrap();

    let mut source = open_replicas(
        &StateUri::Shm { dir: dir.clone() },
        Some("router-me"),
        options(),
    )
    .unwrap();
    let reading = source.read().unwrap();
    assert!(reading.errors.is_empty(), "{:?}", reading.errors);
    let ids: Vec<&str> = reading.replicas.iter().map(|r| &*r.replica_id).collect();
    assert_eq!(ids, ["router-a", "router-b"], "sorted, own left out");
    let a_state = reading.get("router-a").unwrap();
    assert_eq!(a_state.status, Status::Fresh);
    assert_eq!(a_state.total_requests(), 3);
    assert_eq!(&*a_state.engines[0].0, "e0");
    assert_eq!(a_state.engines[0].1, reserved(2));
    assert!(a_state.changed_age.is_some());
    assert_eq!(reading.get("router-b").unwrap().engines[0].1, reserved(5));
    let json = serde_json::to_value(a_state).unwrap();
    assert_eq!(json["engines"]["e1"]["num_requests"], 1);

    // A change is seen by the next read; a removed engine is gone.
    a.set("e0", &reserved(0)).unwrap();
    a.remove("e1").unwrap();
    let reading = source.read().unwrap();
    let a_state = reading.get("router-a").unwrap();
    assert_eq!(a_state.engines.len(), 1);
    assert_eq!(a_state.total_requests(), 0);

    // A closed replica reads dead, then is gone.
    drop(b);
    let reading = source.read().unwrap();
    assert!(reading.get("router-b").is_none(), "removed at close");
}

#[test]
fn a_silent_replica_goes_stale_and_a_retired_one_dead() {
    let state_dir = tempfile::tempdir().unwrap();
    let dir = state_dir.path().join("state");
    let mut a = writer(&dir, "router-a");
    a.set("e0", &reserved(1)).unwrap();
    let beat = a.heartbeat();
    let mut source = ShmReplicas::open(&dir, None, options()).unwrap();
    let mut reading = ReplicaReading::default();
    let now = monotonic_now();
    source.read_at(&mut reading, now).unwrap();
    assert_eq!(reading.replicas[0].status, Status::Fresh);
    // 3 s later without a beat: stale (the engines' 2 s bound).
    source.read_at(&mut reading, now + 3_000_000_000).unwrap();
    assert_eq!(reading.replicas[0].status, Status::Stale);
    assert!(reading.replicas[0].heartbeat_age >= Duration::from_secs(3));
    assert!(beat.beat());
    a.retire();
    source.read_at(&mut reading, monotonic_now()).unwrap();
    assert!(
        reading.replicas.iter().all(|r| r.status == Status::Dead),
        "retired (and removed: listed no more) {:?}",
        reading.replicas
    );
}

fn monotonic_now() -> u64 {
    engine_state_shm_format::monotonic_ns()
}

#[test]
fn no_directory_is_no_replica_and_foreign_files_are_per_replica_errors() {
    let state_dir = tempfile::tempdir().unwrap();
    let dir = state_dir.path().join("state");
    let mut source = ShmReplicas::open(&dir, None, options()).unwrap();
    let reading = source.read().unwrap();
    assert!(reading.replicas.is_empty() && reading.errors.is_empty());

    let mut a = writer(&dir, "router-a");
    a.set("e0", &reserved(1)).unwrap();
    let routers = routers_dir(&dir);
    std::fs::write(routers.join("junk"), b"not a router file at all").unwrap();
    std::fs::create_dir(routers.join("subdir")).unwrap();
    std::fs::write(routers.join(".tmp.123"), b"a writer's temporary file").unwrap();
    let reading = source.read().unwrap();
    assert_eq!(reading.replicas.len(), 1, "the good replica is still read");
    let names: Vec<&str> = reading.errors.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["junk", "subdir"]);
    for error in &reading.errors {
        assert!(!error.error.to_string().is_empty());
    }
}
