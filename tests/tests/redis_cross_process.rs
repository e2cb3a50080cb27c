//! Publish → Redis → read, across processes and languages: a Python
//! publisher (the Rust core behind `engine_state.Publisher`) writes to a real
//! redis-server; the Rust reader, `esdump --json` and the Python `Reader`
//! see the same state.

use std::process::Command;

use engine_state_reader::Status;
use engine_state_reader::DEFAULT_STALE_AFTER;
use engine_state_tests::*;

#[test]
fn python_publisher_to_rust_reader_esdump_and_python_reader() {
    let redis = RedisServer::start();
    let uri = redis.uri("?prefix=xproc:");
    let _publishers: Vec<Proc> = (0..2)
        .map(|i| {
            python_publisher_at(
                &uri,
                &format!("py-{i}"),
                &format!(
                    "pub.publish(step=5, num_running={}, num_waiting=1, gpu_blocks_total=800, \
                     gpu_blocks_free=200, max_prefill_remaining=31000)",
                    i + 6
                ),
            )
        })
        .collect();

    let mut source = test_reader(&uri, DEFAULT_STALE_AFTER);
    wait_for(
        || {
            source
                .read()
                .unwrap()
                .engines
                .iter()
                .filter(|e| e.snapshot.step == 5)
                .count()
                == 2
        },
        "both Python engines via Redis",
    );
    let reading = source.read().unwrap();
    let e = reading.get("py-1").unwrap();
    assert_eq!(e.status, Status::Fresh);
    assert_eq!(
        (
            e.snapshot.num_running,
            e.snapshot.num_waiting,
            e.snapshot.max_prefill_remaining
        ),
        (7, 1, 31000)
    );
    assert_eq!(e.gpu_kv_used_frac(), Some(0.75));

    let (dumped, _) = esdump_json(&uri);

    let script = format!(
        "import json\nfrom engine_state import Reader\n\
         r = Reader(uri={uri:?})\nprint(json.dumps([s.to_dict() for s in r.read()]))\n\
         assert r.errors == [], r.errors\n"
    );
    let out = Command::new(python())
        .arg("-c")
        .arg(script)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let from_python: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    for engines in [&dumped, &from_python] {
        let engines = engines.as_array().unwrap();
        assert_eq!(engines.len(), 2);
        for (i, engine) in engines.iter().enumerate() {
            assert_eq!(engine["engine_id"], format!("py-{i}"));
            assert_eq!(engine["status"], "fresh");
            assert_eq!(engine["num_running"], 6 + i as u64);
            assert_eq!(engine["max_prefill_remaining"], 31000);
            assert_eq!(engine["gpu_kv_used_frac"], 0.75);
            let rust = reading.get(&format!("py-{i}")).unwrap();
            assert_eq!(engine["captured_mono_ns"], rust.snapshot.captured_mono_ns);
        }
    }
}
