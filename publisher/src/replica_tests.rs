//! The replica publisher on shared memory: a router's changes reach the
//! file, a second writer of the id is refused, a removed file comes back,
//! close removes it.

use std::time::{Duration, Instant};

use engine_state_router::{Request, Router, RouterSettings};
use engine_state_shm_format::{routers_dir, RouterFile};

use super::*;

fn uri(dir: &Path) -> StateUri {
    StateUri::parse(&format!("file://{}", dir.display())).unwrap()
}

fn id(name: &str) -> EngineId {
    EngineId::new(name).unwrap()
}

/// Polls `condition` until it holds, for at most 10 s.
fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

#[test]
fn a_routers_changes_reach_its_file_and_close_removes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let publisher =
        ReplicaPublisher::start(&uri(&dir), &id("r1"), ReplicaOptions::default()).unwrap();
    let path = publisher.path().unwrap().to_owned();
    assert_eq!(path, routers_dir(&dir).join("r1"));
    let stats = publisher.stats();
    let router = Router::with_instances(RouterSettings::default(), ["e0", "e1"]).unwrap();
    router.set_reservation_sink(Some(Box::new(publisher)));
    let reader = RouterFile::open(&path).unwrap();
    let record = reader.read().unwrap();
    assert_eq!(record.engines.len(), 2, "both instances listed at once");
    assert!(record.engines.iter().all(|(_, r)| r.is_zero()));

    let (decision, mut held) = router
        .pick(&Request::from_tokens("a", vec![3; 2000]))
        .unwrap();
    let on = |record: &engine_state_shm_format::RouterRecord| {
        record
            .engines
            .iter()
            .find(|(e, _)| e.as_str() == decision.instance_id)
            .unwrap()
            .1
    };
    let counters = on(&reader.read().unwrap());
    assert_eq!(
        counters,
        router.instance(&decision.instance_id).unwrap().shadow
    );
    assert_eq!(
        (counters.num_requests, counters.pending_prefill_tokens),
        (1, 2000)
    );
    held.prefill_done();
    assert_eq!(on(&reader.read().unwrap()).ongoing_decode_tokens, 2000);
    held.complete();
    assert!(on(&reader.read().unwrap()).is_zero());

    router.remove_instance("e1").unwrap();
    assert_eq!(reader.read().unwrap().engines.len(), 1);
    assert_eq!(stats.errors(), 0, "{:?}", stats.last_error());
    // The heartbeat thread stamps the file.
    let first = reader.heartbeat_mono_ns();
    eventually("a heartbeat", || reader.heartbeat_mono_ns() > first);

    router.set_reservation_sink(None); // drops the publisher: closed
    assert!(!path.exists(), "close removes the file");
    assert!(reader.is_retired());
}

#[test]
fn a_second_publisher_of_the_id_is_refused_and_errors_are_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let first = ReplicaPublisher::start(&uri(&dir), &id("r1"), ReplicaOptions::default()).unwrap();
    let error = ReplicaPublisher::start(&uri(&dir), &id("r1"), ReplicaOptions::default())
        .unwrap_err()
        .to_string();
    assert!(error.contains("already used by a live process"), "{error}");

    first.set("not a valid id!", &Reservations::default());
    assert_eq!(first.stats().errors(), 1);
    assert!(first
        .stats()
        .last_error()
        .unwrap()
        .contains("not a valid id!"));
}

#[test]
fn a_file_removed_by_another_process_is_put_back_with_its_reservations() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let options = ReplicaOptions {
        heartbeat_period: Duration::from_millis(2),
        ..ReplicaOptions::default()
    };
    let publisher = ReplicaPublisher::start(&uri(&dir), &id("r1"), options).unwrap();
    let busy = Reservations {
        num_requests: 3,
        ..Reservations::default()
    };
    publisher.set("e0", &busy);
    let path = publisher.path().unwrap().to_owned();
    std::fs::remove_file(&path).unwrap();
    eventually("the file put back", || path.exists());
    let stats = publisher.stats();
    eventually("the recreation counted", || stats.recreated() == 1);
    let record = RouterFile::open(&path).unwrap().read().unwrap();
    assert_eq!(record.engines[0].1, busy);
    assert_eq!(record.generation, 2);
}
