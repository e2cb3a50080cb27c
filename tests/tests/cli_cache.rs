//! `espublish --cache-blocks N` → `esdump --cache ENGINE`, real processes,
//! on shared memory and on a real redis-server: the digest esdump prints is
//! exactly shm-format's `block_hashes` of the token ids 0..N*512, and every
//! error case says what is wrong.

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::process::{Command, Output};

use engine_state_shm_format::blocks::{block_hashes, BLOCK_TOKENS};
use engine_state_shm_format::cache_dir;
use engine_state_shm_format::digest_layout::DIGEST_ENTRIES_OFFSET;
use engine_state_tests::{bin, esdump_json, espublish, wait_for, RedisServer};

/// What esdump must print for `--cache-blocks n`: the hashes, ascending, as hex.
fn expected_blocks(n: usize) -> Vec<String> {
    let tokens: Vec<u32> = (0..(n * BLOCK_TOKENS) as u32).collect();
    let mut hashes = block_hashes(&tokens);
    assert_eq!(hashes.len(), n);
    hashes.sort_unstable();
    hashes.iter().map(|h| format!("{h:016x}")).collect()
}

fn esdump(args: &[&str]) -> Output {
    Command::new(bin("esdump"))
        .args(args)
        .output()
        .expect("run esdump")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `esdump --cache id --uri uri` (plus `extra`), polled until it succeeds
/// (a Redis digest is written by the publisher's sink thread).
fn esdump_cache_ok(uri: &str, id: &str, extra: &[&str]) -> Output {
    let mut last = None;
    wait_for(
        || {
            let mut args = vec!["--uri", uri, "--cache", id];
            args.extend_from_slice(extra);
            let out = esdump(&args);
            let ok = out.status.success();
            last = Some(out);
            ok
        },
        "esdump --cache to succeed",
    );
    last.expect("set by the wait")
}

/// Every check of one published digest of `n` blocks at `uri`.
fn digest_is_shown_exactly(uri: &str, n: usize, capacity: &str) {
    let _publisher = espublish(uri, "cache-e0", &["--cache-blocks", &n.to_string()]);
    let out = esdump_cache_ok(uri, "cache-e0", &[]);
    let stdout = text(&out.stdout);
    let mut lines = stdout.lines();
    let header = lines.next().expect("a header line");
    for field in [
        "engine cache-e0".to_owned(),
        "status fresh".to_owned(),
        "version 1".to_owned(),
        format!("count {n}"),
        format!("held {n}"),
        format!("capacity {capacity}"),
        "kv_block_size -".to_owned(),
        "captured_age_ms ".to_owned(),
    ] {
        assert!(header.contains(&field), "{field:?} not in {header:?}");
    }
    let blocks: Vec<String> = lines.map(str::to_owned).collect();
    assert_eq!(blocks, expected_blocks(n));
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));

    let out = esdump_cache_ok(uri, "cache-e0", &["--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["engine_id"], "cache-e0");
    assert_eq!(json["status"], "fresh");
    assert_eq!(json["version"], 1);
    assert_eq!(json["count"], n);
    assert_eq!(json["held"], n);
    assert!(json["captured_age_ms"].as_f64().unwrap() >= 0.0);
    let blocks: Vec<String> = json["blocks"]
        .as_array()
        .expect("blocks")
        .iter()
        .map(|b| b.as_str().expect("a string").to_owned())
        .collect();
    assert_eq!(blocks, expected_blocks(n));

    // The fleet view counts the entries too.
    let (fleet, _) = esdump_json(uri);
    assert_eq!(fleet[0]["cache_blocks"], n);
    assert_eq!(fleet[0]["cache_version"], 1);
    let table = esdump(&["--uri", uri]);
    let table = text(&table.stdout);
    let mut rows = table.lines();
    let labels: Vec<&str> = rows.next().unwrap().split_whitespace().collect();
    let row: Vec<&str> = rows.next().unwrap().split_whitespace().collect();
    let cache = labels
        .iter()
        .position(|l| *l == "CACHE")
        .expect("a CACHE column");
    assert_eq!(row[cache], n.to_string(), "{table}");
}

#[test]
fn shm_digest_is_block_hashes_of_the_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", tmp.path().join("engines").display());
    std::fs::create_dir(tmp.path().join("engines")).unwrap();
    digest_is_shown_exactly(&uri, 5, "5");
}

#[test]
fn redis_digest_is_block_hashes_of_the_tokens() {
    let server = RedisServer::start();
    // A Redis value holds exactly its entries: the writer's capacity is unknown.
    digest_is_shown_exactly(&server.uri("?prefix=cli-cache:"), 7, "-");
}

#[test]
fn errors_say_what_is_wrong() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("engines");
    std::fs::create_dir(&dir).unwrap();
    let uri = format!("file://{}", dir.display());
    let _plain = espublish(&uri, "plain", &[]);
    let _digest = espublish(&uri, "digest", &["--cache-blocks", "3"]);
    let failed = |args: &[&str], says: &[&str]| {
        let out = esdump(args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out.stdout));
        for s in says {
            assert!(stderr.contains(s), "{args:?}: {s:?} not in {stderr}");
        }
    };
    failed(
        &["--uri", &uri, "--cache", "nobody"],
        &["no engine \"nobody\"", "engines there: digest, plain"],
    );
    failed(
        &["--uri", &uri, "--cache", "plain", "--json"],
        &["publishes no cache digest", "cache_version is 0"],
    );
    failed(&["--uri", &uri, "--cache", "a/b"], &["invalid engine id"]);

    // The entries out of order, in place (the live writer's file keeps its size).
    let path = cache_dir(Path::new(&dir)).join("digest");
    let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.seek(SeekFrom::Start(DIGEST_ENTRIES_OFFSET as u64))
        .unwrap();
    file.write_all(&u64::MAX.to_le_bytes()).unwrap();
    failed(
        &["--uri", &uri, "--cache", "digest"],
        &["(corrupt_cache)", "strictly ascending", "remove it"],
    );

    let out = Command::new(bin("espublish"))
        .args([
            "--uri",
            &uri,
            "--engine-id",
            "big",
            "--cache-blocks",
            "131073",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("at most 131072"),
        "{}",
        text(&out.stderr)
    );
    assert!(!dir.join("big").exists(), "nothing was published");
}

#[test]
fn a_stale_engines_digest_is_shown_and_said_stale() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("engines");
    std::fs::create_dir(&dir).unwrap();
    let uri = format!("file://{}", dir.display());
    // One heartbeat a minute: with --stale-after-ms 1 it reads stale at once.
    let _publisher = espublish(
        &uri,
        "slow",
        &["--cache-blocks", "2", "--period-ms", "60000"],
    );
    let mut out = None;
    wait_for(
        || {
            let o = esdump(&["--uri", &uri, "--cache", "slow", "--stale-after-ms", "1"]);
            let stale = o.status.success() && text(&o.stdout).contains("status stale");
            out = Some(o);
            stale
        },
        "esdump --cache to show the engine stale",
    );
    let out = out.unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(
        stdout.lines().skip(1).collect::<Vec<_>>(),
        expected_blocks(2),
        "{stdout}"
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("\"slow\" is stale") && stderr.contains("routers do not use it"),
        "{stderr}"
    );
}

#[test]
fn redis_damaged_digest_gives_its_class() {
    let server = RedisServer::start();
    let uri = server.uri("?prefix=cli-bad:");
    let _publisher = espublish(&uri, "bad-e0", &["--cache-blocks", "2"]);
    esdump_cache_ok(&uri, "bad-e0", &[]);
    // The digest does not change, so its publisher does not write it again.
    redis::cmd("SET")
        .arg("cli-bad:cache:bad-e0")
        .arg("not a digest")
        .query::<()>(&mut server.connection())
        .unwrap();
    let out = esdump(&["--uri", &uri, "--cache", "bad-e0"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("at cli-bad:cache:bad-e0 cannot be used (not_digest)"),
        "{stderr}"
    );
}
