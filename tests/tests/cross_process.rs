//! Python publisher ↔ Rust reader and esdump, across processes.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

use engine_state_reader::{ReaderOptions, ShmDir, Source, Status};
use engine_state_tests::*;

fn fast() -> ReaderOptions {
    test_options(engine_state_reader::DEFAULT_STALE_AFTER)
}

const PUBLISH: &str = "pub.publish(step=41, num_running=3, num_waiting=2, gpu_blocks_total=1000, \
     gpu_blocks_free=250, pending_prefill_tokens=9000, ongoing_decode_tokens=1234, num_prefilling=1, \
     max_prefill_remaining=8000, num_preempted=1)";

#[test]
fn python_publisher_is_read_by_the_rust_reader() {
    let dir = tempfile::tempdir().unwrap();
    let _py = python_publisher(dir.path(), "py-0", PUBLISH);
    let mut source = ShmDir::open(dir.path(), fast()).unwrap();
    let reading = source.read().unwrap();
    assert!(reading.errors.is_empty(), "{:?}", reading.errors);
    let e = reading.get("py-0").unwrap();
    let s = &e.snapshot;
    assert_eq!(e.status, Status::Fresh);
    assert_eq!(
        (
            s.step,
            s.num_running,
            s.num_waiting,
            s.gpu_blocks_total,
            s.gpu_blocks_free
        ),
        (41, 3, 2, 1000, 250)
    );
    assert_eq!(
        (
            s.pending_prefill_tokens,
            s.ongoing_decode_tokens,
            s.num_prefilling,
            s.max_prefill_remaining,
            s.num_preempted
        ),
        (9000, 1234, 1, 8000, 1)
    );
    assert!(!s.is_idle());
    assert_eq!(e.gpu_kv_used_frac(), Some(0.75));
}

/// The heartbeat thread is native: it keeps stamping while the Python
/// thread holds the GIL inside one long C call. The Python side records, on
/// `CLOCK_MONOTONIC` (the heartbeat's clock), when that call began and
/// ended; the test collects the stamps it sees until the call has ended and
/// counts those inside it (a heartbeat that needed the GIL stores none). The
/// call starts when the test writes to a FIFO, once it is ready to watch.
#[test]
fn heartbeat_needs_no_gil() {
    let dir = tempfile::tempdir().unwrap();
    let aside = tempfile::tempdir().unwrap(); // not in the engines' directory
    let (go, marks) = (aside.path().join("go"), aside.path().join("marks"));
    nix::unistd::mkfifo(&go, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    // sum(range(...)) runs in C without releasing the GIL for ~1-2 s. The
    // marks are written aside and renamed into place: the test never reads
    // half of them.
    let _py = python_publisher(
        dir.path(),
        "gil",
        &format!(
            "import os, threading, time\n\
             def hog():\n\
             \x20   open({go:?}).read()\n\
             \x20   begun = time.monotonic_ns()\n\
             \x20   sum(range(60_000_000))\n\
             \x20   ended = time.monotonic_ns()\n\
             \x20   with open({marks:?} + '.tmp', 'w') as f:\n\
             \x20       f.write(f'{{begun}} {{ended}}')\n\
             \x20   os.rename({marks:?} + '.tmp', {marks:?})\n\
             threading.Thread(target=hog).start()",
            go = go.display().to_string(),
            marks = marks.display().to_string()
        ),
    );
    let file = engine_state_shm_format::ShmFile::open(dir.path().join("gil")).unwrap();
    // Opened without blocking (ENXIO until the Python thread opens the FIFO
    // for reading), so a thread that never gets there fails the wait.
    let mut fifo = None;
    wait_for(
        || match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
            .open(&go)
        {
            Ok(f) => {
                fifo = Some(f);
                true
            }
            Err(e) if e.raw_os_error() == Some(nix::libc::ENXIO) => false,
            Err(e) => panic!("open the FIFO {}: {e}", go.display()),
        },
        "the Python thread to open the FIFO",
    );
    fifo.unwrap().write_all(b"go").unwrap(); // then closed: the thread reads EOF
    let mut stamps = std::collections::BTreeSet::new();
    let mut window = None;
    wait_for_within(
        Duration::from_secs(60),
        || {
            stamps.insert(file.heartbeat_mono_ns());
            window = std::fs::read_to_string(&marks).ok().and_then(|text| {
                let (begun, ended) = text.split_once(' ')?;
                Some((begun.parse::<u64>().ok()?, ended.parse::<u64>().ok()?))
            });
            window.is_some()
        },
        "the Python thread's long C call to end",
    );
    let (begun, ended) = window.unwrap();
    let inside = stamps.range(begun + 1..ended).count();
    let held_ms = (ended - begun) / 1_000_000;
    eprintln!("{inside} heartbeat stamps seen during the {held_ms} ms the GIL was held");
    // One stamp a period while the GIL is held (at worst every other
    // period: a tick skips a stamp younger than a period); the test sees
    // most of them (it polls every 5 ms), a heartbeat held by the GIL none.
    // At least a quarter of the periods (and 5): a heartbeat that stalls
    // for most of the call fails too, not only one that stops.
    let periods = (ended - begun) / PYTHON_PUBLISH_PERIOD.as_nanos() as u64;
    assert!(
        inside as u64 >= (periods / 4).max(5),
        "{inside} heartbeat stamps during the {held_ms} ms ({periods} periods) the GIL was held \
         ({} seen in all)",
        stamps.len()
    );
}

#[test]
fn esdump_json_reads_a_python_publisher() {
    let dir = tempfile::tempdir().unwrap();
    let _py = python_publisher(dir.path(), "py-json", PUBLISH);
    let (value, _) = esdump_json(&format!("file://{}", dir.path().display()));
    let engines = value.as_array().unwrap();
    assert_eq!(engines.len(), 1);
    let e = engines[0].as_object().unwrap();
    let mut keys: Vec<&str> = e.keys().map(String::as_str).collect();
    keys.sort_unstable();
    let mut expected = engine_state_reader::JSON_KEYS.to_vec();
    expected.sort_unstable();
    assert_eq!(keys, expected);
    assert_eq!(e["engine_id"], "py-json");
    assert_eq!(e["status"], "fresh");
    assert_eq!(e["pending_prefill_tokens"], 9000);
    assert_eq!(e["gpu_kv_used_frac"], 0.75);
}

#[test]
fn killed_publisher_shows_as_dead() {
    let dir = tempfile::tempdir().unwrap();
    let mut py = python_publisher(dir.path(), "victim", PUBLISH);
    let mut source = ShmDir::open(dir.path(), fast()).unwrap();
    assert_eq!(
        source.read_engine("victim").unwrap().unwrap().status,
        Status::Fresh
    );
    py.kill();
    let e = source.read_engine("victim").unwrap().unwrap();
    assert_eq!(e.status, Status::Dead, "{e:?}");
    assert_eq!(
        e.snapshot.num_running, 3,
        "the last snapshot stays readable"
    );
}

/// A restarted engine (same id) replaces the file with a new generation;
/// a reader switches over and never mixes the two writers' data.
#[test]
fn engine_restart_switches_generation_without_mixing() {
    let dir = tempfile::tempdir().unwrap();
    let loop_body = |marker: u64| {
        format!(
            "import threading, time\n\
             def run():\n    step = 0\n    while True:\n        step += 1\n        \
             pub.publish(step=step, num_running={marker}, num_waiting={marker})\n        time.sleep(0.0005)\n\
             threading.Thread(target=run, daemon=True).start()"
        )
    };
    let mut first = python_publisher(dir.path(), "eng", &loop_body(1));
    let options = ReaderOptions {
        rescan_interval: Duration::from_secs(3600),
        ..ReaderOptions::default()
    };
    let mut source = ShmDir::open(dir.path(), options).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    let mut check = |source: &mut ShmDir| {
        let e = source.read_engine("eng").unwrap().unwrap();
        if e.status != Status::Torn {
            let s = e.snapshot;
            assert_eq!(s.num_running, s.num_waiting, "mixed snapshot {s:?}");
            if s.num_running != 0 {
                assert_eq!(
                    s.num_running, e.generation,
                    "generation {} shows writer {}",
                    e.generation, s.num_running
                );
            }
            seen.insert(e.generation);
        }
        e
    };
    for _ in 0..200 {
        check(&mut source);
    }
    first.kill();
    // Noticed from the mapping alone: a late heartbeat triggers a pid check.
    wait_for(
        || check(&mut source).status == Status::Dead,
        "the killed writer to read as dead",
    );
    let _second = python_publisher(dir.path(), "eng", &loop_body(2));
    // The old mapping is retired by the new writer; the reader reopens it
    // without a directory listing (rescan interval is an hour here).
    wait_for(
        || check(&mut source).generation == 2,
        "the reader to switch to generation 2",
    );
    for _ in 0..2000 {
        check(&mut source);
    }
    let last = check(&mut source);
    assert_eq!(
        (last.status, last.generation, last.snapshot.num_running),
        (Status::Fresh, 2, 2)
    );
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), [1, 2]);
}
