//! A writer killed in the middle of a write leaves the sequence odd forever:
//! readers report `torn` within their retry bound instead of spinning. A
//! killed writer that its parent has not reaped yet (a zombie) reads `dead`.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use engine_state_reader::{ShmDir, Source, Status};
use engine_state_shm_format::layout::SEQ_OFFSET;
use engine_state_shm_format::seqlock;
use engine_state_tests::*;
use nix::sys::signal::{kill, Signal};

/// Reads the sequence word of a file through a read-only mapping.
fn seq_of(map: &memmap2::Mmap) -> u64 {
    // SAFETY: the mapping is 4096 bytes and page aligned, SEQ_OFFSET is 8-aligned
    // and inside it; the word is only ever accessed atomically.
    let word = unsafe { &*(map.as_ptr().add(SEQ_OFFSET) as *const AtomicU64) };
    word.load(Ordering::Relaxed)
}

#[test]
fn writer_killed_mid_write_reads_as_torn_within_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", dir.path().display());
    let path = dir.path().join("mid");
    // Stop the stress writer at random points until it is caught between its
    // two sequence stores, then kill it there: a real mid-write death.
    let mut caught = false;
    for _attempt in 0..50 {
        let mut writer = Proc::spawn(
            Command::new(bin("espublish"))
                .args([
                    "--stress",
                    "--engine-id",
                    "mid",
                    "--duration",
                    "60",
                    "--uri",
                    &uri,
                ])
                .stdout(Stdio::null()),
        );
        wait_for(|| path.exists(), "the stress writer's file");
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: read-only shared mapping of a file that is never truncated.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        for _ in 0..200 {
            kill(writer.pid(), Signal::SIGSTOP).unwrap();
            std::thread::sleep(Duration::from_micros(200));
            if seq_of(&map) % 2 == 1 {
                writer.kill(); // SIGKILL while stopped mid-write
                caught = true;
                break;
            }
            kill(writer.pid(), Signal::SIGCONT).unwrap();
            std::thread::sleep(Duration::from_micros(300));
        }
        if caught {
            assert_eq!(seq_of(&map) % 2, 1, "the sequence stays odd after the kill");
            break;
        }
        writer.kill();
        let _ = std::fs::remove_file(&path);
    }
    assert!(caught, "never caught the writer mid-write");

    let mut source = ShmDir::open(
        dir.path(),
        test_options(engine_state_reader::DEFAULT_STALE_AFTER),
    )
    .unwrap();
    // Bounded retries, counted: the source's read spends the seqlock's
    // retry bound once (not retried by the layers above). It returns within
    // a deadline, not a timing (the host may be busy; 5 s is far beyond the
    // bound's spins and yields, and fails a retry that sleeps).
    let (source, reading, attempts) =
        returns_within(Duration::from_secs(5), "a read of a torn file", move || {
            let before = seqlock::failed_attempts();
            let reading = source.read().unwrap();
            let attempts = seqlock::failed_attempts() - before;
            (source, reading, attempts)
        });
    let e = &reading.engines[0];
    assert_eq!(e.status, Status::Torn, "{e:?}");
    assert_eq!(
        attempts,
        u64::from(seqlock::READ_SPINS + seqlock::READ_YIELDS),
        "one bounded read of the torn file"
    );
    assert_eq!(source.torn_spins(), 1);
    let (value, _) = esdump_json(&uri);
    assert_eq!(value[0]["status"], "torn");
}

/// The state letter of `/proc/<pid>/stat` (after the last `)`), or `None`
/// when the process is gone (reaped).
fn proc_state(pid: nix::unistd::Pid) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.rfind(')')?;
    stat[close + 1..].trim_start().chars().next()
}

/// A writer (espublish) killed with SIGKILL by this process, its parent,
/// which does not reap it yet: a zombie, which `kill(pid, 0)` still finds.
/// Readers report it `dead` while it is a zombie — in process (the Rust
/// reader) and in another process (esdump) — long before its heartbeat
/// would make it stale (`stale_after` is an hour here). The Go package's
/// `TestZombieWriterIsDead` is the same test.
#[test]
fn a_killed_writer_not_yet_reaped_is_dead() {
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", dir.path().display());
    let writer = Proc::spawn(
        Command::new(bin("espublish"))
            .args(["--engine-id", "zombie", "--period-ms", "20", "--uri", &uri])
            .stdout(Stdio::null()),
    );
    let mut source = ShmDir::open(dir.path(), test_options(Duration::from_secs(3600))).unwrap();
    wait_for_engine(&mut source, "zombie", "the writer's first snapshot", |e| {
        e.status == Status::Fresh
    });
    // SIGKILL without waiting: `writer` (a `Proc`) reaps it only when dropped.
    kill(writer.pid(), Signal::SIGKILL).unwrap();
    wait_for(
        || proc_state(writer.pid()) == Some('Z'),
        "the killed writer to be a zombie",
    );
    assert_eq!(
        kill(writer.pid(), None),
        Ok(()),
        "kill(pid, 0) finds a zombie: what this test is about"
    );
    // Dead once its heartbeat is late (two periods); the wait's 10 s is only
    // a bound for a loaded host.
    wait_for_engine(&mut source, "zombie", "a zombie writer read dead", |e| {
        e.status == Status::Dead
    });
    let (json, stderr) = esdump_json(&uri);
    assert_eq!(json[0]["status"], "dead", "{json} {stderr}");
    assert_eq!(
        proc_state(writer.pid()),
        Some('Z'),
        "still a zombie: the readers did not wait for it to be reaped"
    );
    drop(writer);
}
