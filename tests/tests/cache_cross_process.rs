//! Cache digests across processes on shared memory: a publisher in a child
//! process (this test executable, run as [`child_publisher`]) writes
//! digests on command, and this process reads them through `ShmDir` with
//! digests on: each version read once, the same `Arc` in between; a child
//! killed (SIGKILL) leaves its engine dead, read with its last digest; a
//! clean close removes the digest with the engine.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use engine_state_reader::{ReaderOptions, ShmDir, Status};
use engine_state_shm_format::{cache_dir, Snapshot};
use engine_state_tests::*;

const CHILD_ENV: &str = "ES_TEST_CACHE_CHILD_DIR";

/// Child mode (a no-op in a normal run): publishes engine `child` into
/// `$ES_TEST_CACHE_CHILD_DIR`; each line `N` on stdin publishes a digest of
/// blocks `1..=N` and a snapshot naming it, then answers `published V` (the
/// digest's version, or `same` when nothing changed); `close` closes.
#[test]
fn child_publisher() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let uri = format!("file://{}", Path::new(&dir).display());
    let mut publisher = start_publisher(&uri, "child", 20).unwrap();
    let mut out = std::io::stdout();
    writeln!(out, "ready").unwrap();
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        if line == "close" {
            publisher.close();
            writeln!(out, "closed").unwrap();
            continue;
        }
        let n: u64 = line.trim().parse().unwrap();
        let blocks: Vec<u64> = (1..=n).collect();
        let written = publisher.publish_cache(&blocks, n, 1024).unwrap();
        publisher.publish(Snapshot::default()).unwrap();
        let answer = if written { "published" } else { "same" };
        writeln!(out, "{answer}").unwrap();
        out.flush().unwrap();
    }
}

struct Child {
    proc: Proc,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Child {
    fn start(dir: &Path) -> Child {
        let mut proc = Proc::spawn(
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "child_publisher",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_ENV, dir)
                .stdout(Stdio::piped()),
        );
        let stdin = proc.0.stdin.take().unwrap();
        let stdout = BufReader::new(proc.0.stdout.take().unwrap());
        let mut child = Child {
            proc,
            stdin,
            stdout,
        };
        assert_eq!(child.line(), "ready");
        child
    }

    /// The child's next line that is its own (not the test harness's).
    fn line(&mut self) -> String {
        loop {
            let mut line = String::new();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "the child exited"
            );
            // The harness may print `test child_publisher ... ` first on
            // the same line.
            let word = line.trim().rsplit(' ').next().unwrap_or_default();
            if ["ready", "published", "same", "closed"].contains(&word) {
                return word.to_owned();
            }
        }
    }

    fn ask(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").unwrap();
        self.stdin.flush().unwrap();
        self.line()
    }
}

#[test]
fn digests_written_by_another_process_are_read_once_per_version() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("engines");
    let mut child = Child::start(&dir);
    let options = ReaderOptions {
        rescan_interval: Duration::ZERO,
        ..ReaderOptions::default()
    }
    .with_cache_digests(true);
    let mut source = ShmDir::open(&dir, options).unwrap();
    assert_eq!(source.read_engine("child").unwrap().unwrap().cache, None);

    assert_eq!(child.ask("3"), "published");
    let first = source.read_engine("child").unwrap().unwrap().cache.unwrap();
    assert_eq!((first.version(), first.blocks()), (1, &[1, 2, 3][..]));
    assert_eq!(child.ask("3"), "same");
    let again = source.read_engine("child").unwrap().unwrap();
    assert!(Arc::ptr_eq(&first, again.cache.as_ref().unwrap()));
    assert_eq!(again.snapshot.cache_blocks, 3);

    // 430 entries, as a ~220k-token engine holds.
    assert_eq!(child.ask("430"), "published");
    let big = source.read_engine("child").unwrap().unwrap().cache.unwrap();
    assert_eq!((big.version(), big.len()), (2, 430));
    assert_eq!(big.leading_blocks(&[1, 2, 3, 999]), 3);

    // Killed: the engine reads dead (its heartbeat stops, its pid is gone),
    // and its last digest is still what its file says.
    child.proc.kill();
    wait_for(
        || {
            source
                .read_engine("child")
                .unwrap()
                .is_some_and(|e| e.status == Status::Dead)
        },
        "the killed engine read dead",
    );
    let dead = source.read_engine("child").unwrap().unwrap();
    assert!(Arc::ptr_eq(&big, dead.cache.as_ref().unwrap()));
}

#[test]
fn a_clean_close_in_another_process_removes_the_digest() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("engines");
    let mut child = Child::start(&dir);
    assert_eq!(child.ask("2"), "published");
    let file = cache_dir(&dir).join("child");
    assert!(file.exists());
    assert_eq!(child.ask("close"), "closed");
    assert!(!file.exists());
    assert!(!dir.join("child").exists());
}
