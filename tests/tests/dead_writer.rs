//! A writer killed in the middle of a write leaves the sequence odd forever:
//! readers report `torn` within their retry bound instead of spinning.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use engine_state_reader::{ShmDir, Source, Status};
use engine_state_shm_format::layout::SEQ_OFFSET;
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
    let started = Instant::now();
    let e = &source.read().unwrap().engines[0];
    assert_eq!(e.status, Status::Torn, "{e:?}");
    assert!(
        started.elapsed() < Duration::from_millis(100),
        "bounded retries, took {:?}",
        started.elapsed()
    );
    let (value, _) = esdump_json(&uri);
    assert_eq!(value[0]["status"], "torn");
}
