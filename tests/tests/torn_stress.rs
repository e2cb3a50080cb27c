//! A writer in another process publishes a self-checking payload as fast as
//! it can; readers must never accept an inconsistent snapshot.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use engine_state_shm_format::{ShmFile, SNAPSHOT_WORDS};
use engine_state_tests::*;
use engine_state_tools::espublish::is_whole_stress_payload;

const READS: u64 = 10_000_000;

#[test]
fn ten_million_reads_accept_no_torn_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let _writer = Proc::spawn(
        Command::new(bin("espublish"))
            .args(["--stress", "--engine-id", "stress", "--duration", "600"])
            .args(["--uri", &format!("file://{}", dir.path().display())])
            .stdout(Stdio::null()),
    );
    let path = dir.path().join("stress");
    wait_for(|| path.exists(), "the stress writer's file");
    let file = ShmFile::open(&path).unwrap();
    let (mut accepted, mut torn, mut changes) = (0u64, 0u64, 0u64);
    let mut last = 0u64;
    let started = Instant::now();
    // At least READS reads, and on until the writer has published 1,000+
    // snapshots during them (bounded): on a loaded 2-core host the writer
    // process may get little CPU in the ~1 s that ten million reads take.
    let mut reads = 0u64;
    while reads < READS || (changes <= 1000 && started.elapsed() < Duration::from_secs(60)) {
        reads += 1;
        match file.read() {
            Ok((snapshot, seq)) => {
                assert!(
                    is_whole_stress_payload(&snapshot),
                    "inconsistent snapshot accepted: {snapshot:?}"
                );
                assert_eq!(seq % 2, 0);
                // The stress writer's v-th snapshot (word 0 is v) is its
                // v-th seqlock write, published under sequence 2v: a copy
                // that pairs a payload with another write's sequence fails.
                let words: [u64; SNAPSHOT_WORDS] = snapshot.to_words();
                assert_eq!(
                    seq,
                    2 * words[0],
                    "payload {} under sequence {seq}",
                    words[0]
                );
                accepted += 1;
                if snapshot.captured_mono_ns != last {
                    assert!(snapshot.captured_mono_ns > last, "went back in time");
                    last = snapshot.captured_mono_ns;
                    changes += 1;
                }
            }
            Err(_) => torn += 1,
        }
    }
    let elapsed = started.elapsed();
    eprintln!("{reads} reads in {elapsed:?}: {accepted} accepted, {torn} torn, {changes} distinct snapshots");
    // The writer really was writing during the reads, and reads mostly succeed.
    assert!(
        changes > 1000,
        "writer barely ran: {changes} distinct snapshots"
    );
    assert!(accepted > reads / 2, "{accepted} of {reads} accepted");
}
