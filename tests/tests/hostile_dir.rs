//! What other processes can put into, or do to, the state directory while
//! the real readers (`esdump`, a Python `Reader`) run: a FIFO, a symbolic
//! link out of the directory, an unreadable file. No reader may hang, follow
//! the link, or stop reading the healthy engines.

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use engine_state_shm_format::{monotonic_ns, EngineId, ShmWriter, Snapshot, WriterOptions};
use engine_state_tests::*;

fn writer(dir: &std::path::Path, id: &str) -> ShmWriter {
    let first = Snapshot {
        captured_mono_ns: monotonic_ns(),
        num_running: 5,
        ..Snapshot::default()
    };
    ShmWriter::create(
        dir,
        &EngineId::new(id).unwrap(),
        &WriterOptions::default(),
        &first,
    )
    .unwrap()
}

/// Runs `command` to its end, or kills it and fails after `limit`.
fn run_within(command: &mut Command, limit: Duration) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{command:?} still running after {limit:?}: it hangs");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_end(&mut stderr)
        .unwrap();
    Output {
        status,
        stdout,
        stderr,
    }
}

const PY_READ_ONCE: &str = "import sys\nfrom engine_state import Reader\n\
    r = Reader(uri=sys.argv[1])\n\
    for s in r.read(): print('engine', s.engine_id, s.status)\n\
    for e in r.errors: print('error', e)\n";

/// A Python `Reader`'s one read of `uri` ([`PY_READ_ONCE`]), in its own
/// process, asserted to succeed: its standard output.
fn python_read_once(uri: &str) -> String {
    let out = run_within(
        Command::new(python()).args(["-c", PY_READ_ONCE, uri]),
        Duration::from_secs(20),
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The `engine <id> <status>` lines of [`python_read_once`]'s output.
fn engine_lines(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter(|l| l.starts_with("engine "))
        .collect()
}

#[test]
fn fifo_and_symbolic_link_neither_hang_nor_escape_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    // A plain writer has no heartbeat thread: stamped before each reader
    // starts (a slow process start must not make it stale).
    let good = writer(dir.path(), "good");
    let _outside = writer(elsewhere.path(), "outside");
    nix::unistd::mkfifo(
        &dir.path().join("x"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    std::os::unix::fs::symlink(elsewhere.path().join("outside"), dir.path().join("outside"))
        .unwrap();
    let uri = format!("file://{}", dir.path().display());

    let out = run_within(
        Command::new(bin("esdump")).args(["--json", "--uri", &uri]),
        Duration::from_secs(10),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<&str> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["engine_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["good"], "the link's target is not read: {stderr}");
    assert!(
        stderr.contains("not a regular file (a FIFO)") && stderr.contains("/x"),
        "{stderr}"
    );
    assert!(
        stderr.contains("symbolic link, not followed") && stderr.contains("/outside"),
        "{stderr}"
    );

    good.stamp_heartbeat(monotonic_ns());
    let stdout = python_read_once(&uri);
    let engines = engine_lines(&stdout);
    assert_eq!(engines, ["engine good fresh"], "{stdout}");
    assert!(
        stdout.contains("error not a regular file (a FIFO)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("error symbolic link, not followed"),
        "{stdout}"
    );
}

/// Files whose stamps are an hour ahead of this host's clock, and at
/// 2^64 - 1 (forged, or written by a writer in another time namespace): the
/// real readers in other processes (esdump, a Python `Reader`) read them
/// stale with a `clock_ahead` error, not fresh with ages 0 for an hour (or
/// forever). The pid namespace word is 0 (`ShmWriter` records ours, so it
/// is cleared): the heartbeat alone decides, as across containers. Go and
/// the C ABI read the same cases from format/vectors.
#[test]
fn stamps_ahead_of_the_clock_never_read_fresh() {
    let dir = tempfile::tempdir().unwrap();
    // A plain writer has no heartbeat thread: stamped before each reader
    // starts (a slow process start must not make it stale).
    let good = writer(dir.path(), "good");
    let hour = 3_600_000_000_000;
    let now = monotonic_ns();
    let mut writers = Vec::new();
    for (id, stamp) in [("hour-ahead", now + hour), ("at-max", u64::MAX)] {
        let mut w = writer(dir.path(), id);
        w.publish(&Snapshot {
            captured_mono_ns: stamp,
            num_running: 5,
            ..Snapshot::default()
        })
        .unwrap();
        w.stamp_heartbeat(stamp);
        // Another pid namespace: no pid check.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join(id))
            .unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, &0u64.to_le_bytes(), 32).unwrap();
        writers.push(w);
    }
    let uri = format!("file://{}", dir.path().display());

    good.stamp_heartbeat(monotonic_ns());
    let (json, stderr) = esdump_json(&uri);
    let status = |id: &str| {
        json.as_array()
            .unwrap()
            .iter()
            .find(|e| e["engine_id"] == id)
            .unwrap_or_else(|| panic!("{id} not read: {json}"))["status"]
            .clone()
    };
    assert_eq!(status("good"), "fresh");
    for id in ["hour-ahead", "at-max"] {
        assert_eq!(status(id), "stale", "{id}: {json}");
        assert!(
            stderr.contains(&format!("/{id}: its heartbeat_mono_ns is ")),
            "{id}: {stderr}"
        );
    }
    assert!(
        stderr.contains("ahead of this reader's CLOCK_MONOTONIC"),
        "{stderr}"
    );

    good.stamp_heartbeat(monotonic_ns());
    let stdout = python_read_once(&uri);
    let engines = engine_lines(&stdout);
    assert_eq!(
        engines,
        [
            "engine at-max stale",
            "engine good fresh",
            "engine hour-ahead stale"
        ],
        "{stdout}"
    );
    for id in ["hour-ahead", "at-max"] {
        assert!(
            stdout.contains(&format!("/{id}: its heartbeat_mono_ns is ")),
            "{id}: {stdout}"
        );
    }
}

/// `esagent` relaying `uri` to `redis_uri`, as a process: what these tests
/// check is that it neither stalls nor dies (of a `SIGBUS`, say).
fn relaying_esagent(uri: &str, redis_uri: &str) -> Proc {
    Proc::spawn(
        Command::new(bin("esagent"))
            .args(["--uri", uri, "--redis", redis_uri, "--period-ms", "20"])
            .args(["--listen", "127.0.0.1:0", "--stale-after-ms", "500"])
            .stdout(Stdio::null()),
    )
}

/// `esagent` with a FIFO and a link out of the directory: it neither stalls
/// nor relays the link's target to Redis, and relays the healthy engine.
#[test]
fn esagent_neither_stalls_on_a_fifo_nor_relays_a_link() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", dir.path().display());
    let _good = espublish(&uri, "good");
    let _outside = espublish(&format!("file://{}", elsewhere.path().display()), "outside");
    nix::unistd::mkfifo(
        &dir.path().join("x"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    std::os::unix::fs::symlink(elsewhere.path().join("outside"), dir.path().join("outside"))
        .unwrap();
    let redis = RedisServer::start();
    let redis_uri = redis.uri("?prefix=hostile-links:&ttl_ms=400");
    let mut agent = relaying_esagent(&uri, &redis_uri);
    let mut remote = test_reader(&redis_uri, Duration::from_millis(500));
    wait_for(
        || {
            running(&mut agent, "esagent");
            remote
                .read()
                .unwrap()
                .get("good")
                .is_some_and(|e| e.is_fresh())
        },
        "esagent relays the healthy engine",
    );
    // Long enough for several full passes over the directory (every 500 ms).
    std::thread::sleep(Duration::from_millis(1200));
    running(&mut agent, "esagent");
    let relayed = remote.read().unwrap();
    let ids: Vec<&str> = relayed.engines.iter().map(|e| &*e.engine_id).collect();
    assert_eq!(ids, ["good"], "{relayed:?}");
}

/// A reader that may not read an engine's file is told it needs read access
/// (and how publishers grant it). Root reads anything, so as root `esdump`
/// runs as `nobody` (via setpriv).
#[test]
fn unreadable_engine_file_says_readers_need_read_access() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let _private = writer(dir.path(), "private"); // mode 600, owned by us
    let uri = format!("file://{}", dir.path().display());
    let mut command = if nix::unistd::geteuid().is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(bin("esdump"));
        c
    } else {
        // Another user's file cannot be made here: check the message's
        // wording only through the file's own permissions.
        std::fs::set_permissions(
            dir.path().join("private"),
            std::fs::Permissions::from_mode(0o200),
        )
        .unwrap();
        Command::new(bin("esdump"))
    };
    let out = run_within(
        command.args(["--json", "--uri", &uri]),
        Duration::from_secs(10),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("Permission denied")
            && stderr.contains("a reader needs read access")
            && stderr.contains("AGENTIC_ENGINE_STATE_FILE_MODE=644"),
        "{stderr}"
    );
}

/// An `espublish` of engine `id` into `uri`, once its first snapshot is out.
fn espublish(uri: &str, id: &str) -> Proc {
    let mut proc = Proc::spawn(
        Command::new(bin("espublish"))
            .args(["--engine-id", id, "--uri", uri, "--period-ms", "20"])
            .args(["--set", "num_running=5", "--duration", "60"])
            .stdout(Stdio::piped()),
    );
    let line = proc.first_line();
    assert!(line.contains("publishing"), "espublish: {line:?}");
    proc
}

/// The last screen `esdump --watch` drew into the file `screen`.
fn last_frame_of(screen: &std::path::Path) -> String {
    let text = std::fs::read_to_string(screen).unwrap();
    text.rsplit("\x1b[2J").next().unwrap_or_default().to_owned()
}

/// Whether the child is still running (and not, e.g., killed by SIGBUS).
fn running(proc: &mut Proc, what: &str) {
    if let Some(status) = proc.0.try_wait().unwrap() {
        panic!("{what} died: {status}");
    }
}

const PY_READ_LOOP: &str = "import json, sys, time\nfrom engine_state import Reader\n\
    r = Reader(uri=sys.argv[1])\n\
    while True:\n\
    \x20   states = {s.engine_id: s.status for s in r.read()}\n\
    \x20   print(json.dumps({'engines': states, 'errors': r.errors}), flush=True)\n\
    \x20   time.sleep(0.02)\n";

/// `truncate -s 0` of a dead engine's file while `esdump --watch`, a Python
/// `Reader` loop and `esagent` have it mapped: none of them dies of SIGBUS
/// (exit 135 before); the engine reads torn, then is reported as a 0-byte
/// file, and the other engine stays fresh throughout. (A live engine's
/// publisher replaces its truncated file: see the next test.)
#[test]
fn truncating_a_mapped_file_kills_no_reader() {
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let uri = format!("file://{}", dir.path().display());
    let mut victim_writer = espublish(&uri, "victim");
    let _other_writer = espublish(&uri, "other");

    let screen_path = dir.path().join(".esdump-screen");
    let screen = std::fs::File::create(&screen_path).unwrap();
    let mut esdump = Proc::spawn(
        Command::new(bin("esdump"))
            .args(["--watch", "--interval", "50", "--uri", &uri])
            .stdout(screen),
    );
    let mut python_reader = Proc::spawn(
        Command::new(python())
            .args(["-c", PY_READ_LOOP, &uri])
            .stdout(Stdio::piped()),
    );
    let python_lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let collector = {
        let lines = python_lines.clone();
        let stdout = python_reader.0.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
                let Ok(line) = line else { break };
                lines.lock().unwrap().push(line);
            }
        })
    };
    let redis = RedisServer::start();
    let redis_uri = redis.uri("?prefix=hostile:&ttl_ms=400");
    let mut agent = relaying_esagent(&uri, &redis_uri);
    let mut remote = test_reader(&redis_uri, Duration::from_millis(500));
    let last_python = || python_lines.lock().unwrap().last().cloned();
    let last_frame = || last_frame_of(&screen_path);
    wait_for(
        || {
            last_frame().contains("victim")
                && remote.read().unwrap().engines.len() == 2
                && last_python().is_some_and(|l| l.contains(r#""victim": "fresh""#))
        },
        "every reader sees both engines",
    );

    // Killed: its file stays (mapped by every reader), and nobody will
    // replace it.
    victim_writer.kill();
    set_len(&dir.path().join("victim"), 0);
    wait_for(
        || {
            running(&mut esdump, "esdump --watch");
            running(&mut python_reader, "the Python Reader");
            running(&mut agent, "esagent");
            last_frame().contains("victim: ")
                && last_python().is_some_and(|l| l.contains("is 0 bytes"))
        },
        "the truncated file reported by esdump and the Python Reader",
    );
    // A few more rounds of every reader over the truncated file: three more
    // esdump frames and Python lines (waited for, not slept), meanwhile
    // esagent's 1 ms change detection went over it many times.
    let frames = || {
        std::fs::read_to_string(&screen_path)
            .unwrap()
            .matches("\x1b[2J")
            .count()
    };
    let (frames_then, lines_then) = (frames(), python_lines.lock().unwrap().len());
    // The readers checked alive on every poll: one killed by SIGBUS fails
    // here as dead, not as a timeout.
    wait_for(
        || {
            running(&mut esdump, "esdump --watch");
            running(&mut python_reader, "the Python Reader");
            running(&mut agent, "esagent");
            frames() >= frames_then + 3 && python_lines.lock().unwrap().len() >= lines_then + 3
        },
        "three more rounds of esdump and the Python Reader over the truncated file",
    );

    let frame = last_frame();
    let other_row = frame.lines().find(|l| l.starts_with("other ")).unwrap();
    assert!(other_row.contains(" fresh "), "{frame}");
    assert!(!frame.lines().any(|l| l.starts_with("victim ")), "{frame}");
    assert!(
        frame.contains("! victim: ") && frame.contains("is 0 bytes"),
        "{frame}"
    );
    let line = last_python().unwrap();
    let parsed: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        parsed["engines"],
        serde_json::json!({"other": "fresh"}),
        "{line}"
    );
    let errors = parsed["errors"].as_array().unwrap();
    assert!(
        errors.len() == 1 && errors[0].as_str().unwrap().contains("victim"),
        "{line}"
    );
    let relayed = remote.read().unwrap();
    assert!(relayed.get("other").unwrap().is_fresh(), "{relayed:?}");
    drop(python_reader);
    collector.join().unwrap();
}

fn set_len(path: &std::path::Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

/// An odd value stored into the sequence word of a live `espublish`'s file
/// by a third process's writable mapping (a stray 8-byte write): readers
/// saw the engine torn for as long as the publisher lived (every later
/// publish went on from the odd value). Now the publisher notices a
/// sequence it did not store and renames a new generation over the file.
#[test]
fn a_stray_odd_sequence_in_a_live_writers_file_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", dir.path().display());
    let path = dir.path().join("poked");
    let mut writer = espublish(&uri, "poked");
    let mut source = test_reader(&uri, Duration::from_millis(500));
    let mut generation = 0;
    wait_for(
        || {
            let reading = source.read().unwrap();
            let seen = reading.get("poked").filter(|e| e.is_fresh());
            generation = seen.map_or(0, |e| e.generation);
            seen.is_some()
        },
        "the engine fresh",
    );
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    // SAFETY: a shared mapping of the whole 4096-byte file, which nobody
    // truncates during the test; the word is 8-aligned and only accessed
    // atomically, as the writer does.
    let map = unsafe { memmap2::MmapMut::map_mut(&file) }.unwrap();
    // SAFETY: as above; the reference does not outlive `map`.
    let seq = unsafe {
        &*(map
            .as_ptr()
            .add(engine_state_shm_format::layout::SEQ_OFFSET)
            .cast::<std::sync::atomic::AtomicU64>())
    };
    seq.store(1_000_001, std::sync::atomic::Ordering::Relaxed);
    drop(map);
    wait_for(
        || {
            running(&mut writer, "espublish (the poked engine's writer)");
            let reading = source.read().unwrap();
            reading.get("poked").is_some_and(|e| {
                e.is_fresh() && e.generation > generation && e.snapshot.num_running == 5
            })
        },
        "the engine fresh again in a new generation after a stray odd sequence",
    );
}

/// `esdump --watch` while its directory is removed and created again: it
/// said nothing and exited (the listing failed). Now it says so on the
/// screen, keeps watching, and shows the engine again once it is back.
#[test]
fn esdump_watch_survives_its_directory_disappearing() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("state");
    std::fs::create_dir(&dir).unwrap();
    let uri = format!("file://{}", dir.display());
    let writer = espublish(&uri, "comes-back");
    let screen_path = base.path().join("screen");
    let screen = std::fs::File::create(&screen_path).unwrap();
    let mut esdump = Proc::spawn(
        Command::new(bin("esdump"))
            .args(["--watch", "--interval", "20", "--uri", &uri])
            .stdout(screen),
    );
    let last_frame = || last_frame_of(&screen_path);
    wait_for(
        || last_frame().contains("comes-back"),
        "the engine on screen",
    );
    drop(writer); // SIGKILL: its file stays
    std::fs::remove_dir_all(&dir).unwrap();
    wait_for(
        || {
            running(&mut esdump, "esdump --watch");
            last_frame().contains("cannot read it now (still watching)")
        },
        "esdump saying the directory cannot be read",
    );
    std::fs::create_dir(&dir).unwrap();
    let _writer = espublish(&uri, "comes-back");
    wait_for(
        || {
            running(&mut esdump, "esdump --watch");
            last_frame().contains("comes-back")
        },
        "the engine on screen again",
    );
}

/// The same with `--json`: standard output stays a stream of JSON documents
/// (no screen codes in it), and the error goes to standard error.
#[test]
fn esdump_watch_json_reports_a_vanished_directory_on_stderr() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("state");
    std::fs::create_dir(&dir).unwrap();
    let uri = format!("file://{}", dir.display());
    let writer = espublish(&uri, "comes-back");
    let out_path = base.path().join("out");
    let err_path = base.path().join("err");
    let mut esdump = Proc::spawn(
        Command::new(bin("esdump"))
            .args(["--watch", "--json", "--interval", "20", "--uri", &uri])
            .stdout(std::fs::File::create(&out_path).unwrap())
            .stderr(std::fs::File::create(&err_path).unwrap()),
    );
    let read = |path: &std::path::Path| std::fs::read_to_string(path).unwrap_or_default();
    wait_for(
        || read(&out_path).contains("comes-back"),
        "the engine in the JSON",
    );
    drop(writer);
    std::fs::remove_dir_all(&dir).unwrap();
    wait_for(
        || {
            running(&mut esdump, "esdump --watch --json");
            read(&err_path).contains("cannot read it now (still watching)")
        },
        "esdump saying on stderr that the directory cannot be read",
    );
    assert!(
        !read(&out_path).contains('\x1b'),
        "no terminal codes in the JSON stream"
    );
}

/// `truncate -s 0`, then a grow to twice the size, of a live `espublish`'s
/// file: the publisher neither dies (its stores into the truncated mapping
/// fault and are absorbed by the `SIGBUS` handler) nor stays invisible (it
/// did before: readers refused the file forever): its heartbeat thread
/// renames a new generation over the file each time, and a reader sees the
/// engine fresh again, with its fields.
#[test]
fn truncating_a_live_writers_file_brings_the_engine_back() {
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let uri = format!("file://{}", dir.path().display());
    let path = dir.path().join("victim");
    let mut writer = espublish(&uri, "victim");
    let mut source = test_reader(&uri, Duration::from_millis(500));
    let mut generation = 0;
    wait_for(
        || {
            let reading = source.read().unwrap();
            let seen = reading.get("victim").filter(|e| e.is_fresh());
            generation = seen.map_or(0, |e| e.generation);
            seen.is_some()
        },
        "the engine fresh",
    );
    for len in [0, 2 * engine_state_shm_format::FILE_SIZE as u64] {
        set_len(&path, len);
        wait_for(
            || {
                running(&mut writer, "espublish (the truncated engine's writer)");
                let reading = source.read().unwrap();
                let back = reading.get("victim").filter(|e| {
                    e.is_fresh() && e.generation > generation && e.snapshot.num_running == 5
                });
                if let Some(back) = back {
                    generation = back.generation;
                }
                back.is_some()
            },
            &format!("the engine fresh again in a new generation after a resize to {len} bytes"),
        );
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            engine_state_shm_format::FILE_SIZE as u64
        );
    }
    // And it still ends cleanly: retired and removed, no temporary file left.
    nix::sys::signal::kill(writer.pid(), nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = writer.0.wait().unwrap();
    assert!(status.success(), "espublish: {status}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
