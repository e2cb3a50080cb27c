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

#[test]
fn fifo_and_symbolic_link_neither_hang_nor_escape_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let _good = writer(dir.path(), "good");
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

    let out = run_within(
        Command::new(python()).args(["-c", PY_READ_ONCE, &uri]),
        Duration::from_secs(20),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let engines: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("engine "))
        .collect();
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
