//! Router replicas' shared reservations read by a real C program
//! (`tests/c/router_read.c`, built with the system compiler against the
//! static library under ASan and UBSan, as `tests/c_cache.rs` builds its
//! program): every router vector of `format/vectors/routers/` with
//! `es_read_router_file` (the reading field by field, or the class), and a
//! live routers directory with `es_open_replicas` / `es_read_replicas`.

mod c_program;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use engine_state_shm_format::{
    routers_dir, EngineId, Reservations, RouterFileWriter, RouterWriterOptions,
};
use serde_json::Value;

use c_program::{build_c, code_line, run_c, vector_json, vectors};

/// Builds `tests/c/router_read.c`.
fn build() -> (tempfile::TempDir, PathBuf) {
    build_c("tests/c/router_read.c", "router_read")
}

fn entry_line(engine_id: &str, c: &Reservations) -> String {
    let words: Vec<String> = c.to_words().iter().map(u64::to_string).collect();
    format!("engine {engine_id} {}", words.join(" "))
}

fn json_entry_line(e: &Value) -> String {
    let counters = Reservations::FIELD_NAMES.map(|name| e[name].as_u64().unwrap());
    entry_line(
        e["engine_id"].as_str().unwrap(),
        &Reservations::from_words(counters),
    )
}

#[test]
fn a_c_program_reads_every_router_vector() {
    let (tmp, exe) = build();
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(vectors().join("manifest.json")).unwrap()).unwrap();
    let cases = manifest["router_cases"].as_array().unwrap();
    assert!(cases.len() >= 20, "{} router cases", cases.len());
    for case in cases {
        let name = case["name"].as_str().unwrap();
        // A reader finds a replica's file under its replica id.
        let dir = tmp.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join(case["replica_id"].as_str().unwrap());
        std::fs::copy(vectors().join(case["file"].as_str().unwrap()), &path).unwrap();
        let lines = run_c(&exe, &["file", path.to_str().unwrap()]);
        match case["error"].as_str() {
            Some(error) => assert_eq!(lines, [code_line(error)], "{name}"),
            None => {
                let e: Value = vector_json(case, "expect");
                let state = if e["state"] == "active" { 1 } else { 2 };
                let mut expected = vec![
                    "code ES_CODE_OK".to_owned(),
                    format!(
                        "file {} {state} {} {} {} {} {} {} {} {} {} {}",
                        e["replica_id"].as_str().unwrap(),
                        e["writer_pid"],
                        e["writer_pid_ns"],
                        e["generation"],
                        e["created_unix_ns"],
                        e["heartbeat_period_us"],
                        e["capacity"],
                        e["seq"],
                        e["heartbeat_mono_ns"],
                        e["changed_mono_ns"],
                        e["count"]
                    ),
                ];
                expected.extend(e["engines"].as_array().unwrap().iter().map(json_entry_line));
                assert_eq!(lines, expected, "{name}");
            }
        }
    }
    // A path that is not there: the open fails.
    let gone = tmp.path().join("gone");
    assert_eq!(
        run_c(&exe, &["file", gone.to_str().unwrap()]),
        ["code ES_CODE_IO"]
    );
}

fn counters(n: u64) -> Reservations {
    Reservations {
        num_requests: n,
        ongoing_tokens: 100 * n,
        pending_prefill_tokens: 30 * n,
        ongoing_decode_tokens: 70 * n,
        num_prefilling: n / 2,
        max_prefill_remaining: 25 * n,
    }
}

/// Live replicas a Rust writer keeps publishing (heartbeats from a thread,
/// as a router's publisher does), read by the C program: its own replica
/// left out, a foreign file a per-replica error, the others fresh with
/// their entries.
#[test]
fn a_c_program_reads_live_replicas_leaving_out_its_own() {
    let (_out, exe) = build();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("engines");
    std::fs::create_dir(&state).unwrap();
    let options = RouterWriterOptions {
        heartbeat_period: Duration::from_millis(10),
        ..RouterWriterOptions::default()
    };
    let writer = |id: &str| RouterFileWriter::create(&state, &EngineId::new(id).unwrap(), &options);
    let mut a = writer("r-a").unwrap();
    a.set("e0", &counters(3)).unwrap();
    a.set("e1", &counters(1)).unwrap();
    let b = writer("r-b").unwrap();
    let mut own = writer("own").unwrap();
    own.set("e0", &counters(9)).unwrap();
    std::fs::write(routers_dir(&state).join("junk"), b"not a router file").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let beats = [a.heartbeat(), b.heartbeat(), own.heartbeat()];
    let beater = std::thread::spawn({
        let stop = Arc::clone(&stop);
        move || {
            while !stop.load(Ordering::Relaxed) {
                for beat in &beats {
                    beat.beat();
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    });
    let uri = format!("file://{}", state.display());
    let lines = run_c(&exe, &["dir", &uri, "own"]);
    stop.store(true, Ordering::Relaxed);
    beater.join().unwrap();
    assert_eq!(
        lines,
        [
            "code ES_CODE_OK".to_owned(),
            format!("replica r-a fresh {} 2", a.generation()),
            entry_line("e0", &counters(3)),
            entry_line("e1", &counters(1)),
            format!("replica r-b fresh {} 0", b.generation()),
            "error junk ES_CODE_NOT_ROUTER".to_owned(),
        ]
    );
    // Without an own id every replica is read; a closed one is gone.
    a.close();
    let lines = run_c(&exe, &["dir", &uri]);
    let replicas: Vec<&str> = lines
        .iter()
        .filter(|l| l.starts_with("replica "))
        .map(|l| l.split(' ').nth(1).unwrap())
        .collect();
    assert_eq!(replicas, ["own", "r-b"], "{lines:?}");
    // An own id that is no replica id is refused.
    let lines = run_c(&exe, &["dir", &uri, "bad/id"]);
    assert!(
        lines[0].starts_with("code ES_CODE_BAD_ARGUMENT"),
        "{lines:?}"
    );
}
