//! The golden vectors of `format/vectors/` (see its README.md): generated
//! here with the real writer code, and read back with the real reader.
//!
//! - `cargo test -p engine-state-reader --test golden_vectors` regenerates
//!   every vector in memory and fails if a committed file differs (the
//!   writer and the committed bytes cannot drift apart), then reads every
//!   committed vector with the Rust reader and checks the expected
//!   `esdump --json` output or error class.
//! - `ENGINE_STATE_BLESS=1 cargo test -p engine-state-reader --test
//!   golden_vectors` rewrites `format/vectors/` from this file (after an
//!   intended format change; review the diff).

mod cache;
mod cases;
mod routers;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use engine_state_reader::redis::{engine_key, Error as RedisError, DEFAULT_PREFIX};
use engine_state_reader::{
    state_at_fetch, Error, FormatError, Freshness, ReaderOptions, Reading, ShmDir,
};
use engine_state_shm_format::pid_namespace;
use serde_json::{json, Value};

use crate::cases::*;

/// `ENGINE_STATE_BLESS` set: regenerate instead of checking.
fn blessing() -> bool {
    std::env::var_os("ENGINE_STATE_BLESS").is_some()
}

fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../format/vectors")
}

/// Every file of `format/vectors/` but README.md, as generated now.
fn generate() -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut cases = Vec::new();
    for case in shm_cases() {
        let file = format!("shm/{}.bin", case.name);
        files.insert(file.clone(), shm_bytes(&case));
        let mut entry = json!({
            "name": case.name,
            "kind": "shm",
            "what": case.what,
            "file": file,
            "engine_id": case.name,
            "same_pid_namespace": case.same_pid_namespace,
        });
        if case.error.is_none() || case.still_read {
            entry["expect"] = json!(format!("shm/{}.json", case.name));
        }
        if let Some(class) = case.error {
            entry["error"] = json!(class);
        }
        if let Some(found) = case.found_version {
            entry["found_version"] = json!(found);
        }
        cases.push(entry);
    }
    for case in redis_cases() {
        let file = format!("redis/{}.bin", case.name);
        files.insert(file.clone(), redis_bytes(&case));
        let mut entry = json!({
            "name": format!("redis_{}", case.name),
            "kind": "redis",
            "what": case.what,
            "file": file,
            "engine_id": case.name,
            "key": engine_key(DEFAULT_PREFIX, case.name),
            "pttl_ms": case.pttl_ms,
        });
        match case.error {
            None => entry["expect"] = json!(format!("redis/{}.json", case.name)),
            Some(class) => entry["error"] = json!(class),
        }
        if let Some(found) = case.found_version {
            entry["found_version"] = json!(found);
        }
        cases.push(entry);
    }
    // Cache residency: digest files and values, and what a reader makes of
    // them (their own list: a binding that reads no digest skips it whole).
    let mut cache_cases = Vec::new();
    for case in cache::cache_cases() {
        let file = format!("cache/{}.bin", case.name);
        let bytes = cache::cache_bytes(&case);
        let mut entry = json!({
            "name": case.name,
            "kind": case.kind,
            "what": case.what,
            "file": file,
            "engine_id": case.name,
            "generation": cache::GENERATION,
        });
        match cache::read_case(case.kind, case.name, &bytes) {
            Ok(output) => {
                assert!(
                    case.error.is_none(),
                    "{}: read, expected {:?}",
                    case.name,
                    case.error
                );
                let expect = format!("cache/{}.json", case.name);
                files.insert(expect.clone(), output.into_bytes());
                entry["expect"] = json!(expect);
            }
            Err((class, found)) => {
                assert_eq!(Some(class), case.error, "{}", case.name);
                assert_eq!(found, case.found_version, "{}", case.name);
                entry["error"] = json!(class);
                if let Some(found) = found {
                    entry["found_version"] = json!(found);
                }
            }
        }
        files.insert(file, bytes);
        cache_cases.push(entry);
    }
    // Shared reservations: router replica files, and what a reader makes
    // of them (their own list, as the cache's).
    let mut router_cases = Vec::new();
    for case in routers::router_cases() {
        let file = format!("routers/{}.bin", case.name);
        let bytes = routers::router_bytes(&case);
        let mut entry = json!({
            "name": case.name,
            "kind": "router_file",
            "what": case.what,
            "file": file,
            "replica_id": case.name,
        });
        match routers::read_case(case.name, &bytes) {
            Ok(output) => {
                assert!(
                    case.error.is_none(),
                    "{}: read, expected {:?}",
                    case.name,
                    case.error
                );
                let expect = format!("routers/{}.json", case.name);
                files.insert(expect.clone(), output.into_bytes());
                entry["expect"] = json!(expect);
            }
            Err((class, found)) => {
                assert_eq!(Some(class), case.error, "{}", case.name);
                assert_eq!(found, case.found_version, "{}", case.name);
                entry["error"] = json!(class);
                if let Some(found) = found {
                    entry["found_version"] = json!(found);
                }
            }
        }
        files.insert(file, bytes);
        router_cases.push(entry);
    }
    files.insert(
        "cache/block_hashes.json".to_owned(),
        cache::block_hash_vectors().into_bytes(),
    );
    let manifest = json!({
        "about": "engine-state golden vectors, layout version 1: see README.md",
        "now_mono_ns": NOW_MONO_NS,
        "stale_after_ms": 2000,
        "max_capture_age_ms": 30000,
        "placeholder_pid_ns": PLACEHOLDER_PID_NS,
        "cases": cases,
        "cache_cases": cache_cases,
        "router_cases": router_cases,
        "block_hashes": "cache/block_hashes.json",
    });
    files.insert(
        "manifest.json".to_owned(),
        (serde_json::to_string_pretty(&manifest).unwrap() + "\n").into_bytes(),
    );
    // The expected outputs: what the Rust reader makes of the files above.
    let manifest: Manifest = Manifest::parse(&files["manifest.json"]);
    for case in &manifest.cases {
        if let Some(expect) = &case.expect {
            let bytes = &files[&case.file];
            let output = match case.kind.as_str() {
                "shm" => esdump_json(&read_shm_dir(&[(case, bytes)], &manifest).engines),
                _ => esdump_json(&[read_redis(case, bytes, &manifest.freshness).unwrap()]),
            };
            files.insert(expect.clone(), output.into_bytes());
        }
    }
    // The whole shared-memory directory at once: per-engine errors never stop the others.
    let shm: Vec<(&Case, &Vec<u8>)> = manifest
        .cases
        .iter()
        .filter(|c| c.kind == "shm")
        .map(|c| (c, &files[&c.file]))
        .collect();
    let all = esdump_json(&read_shm_dir(&shm, &manifest).engines);
    files.insert("shm/all.json".to_owned(), all.into_bytes());
    files
}

/// `esdump --json`'s standard output for these engines.
fn esdump_json(engines: &[engine_state_reader::EngineState]) -> String {
    serde_json::to_string_pretty(engines).unwrap() + "\n"
}

struct Manifest {
    now_mono_ns: u64,
    placeholder_pid_ns: u64,
    freshness: Freshness,
    cases: Vec<Case>,
}

struct Case {
    name: String,
    kind: String,
    file: String,
    engine_id: String,
    key: String,
    pttl_ms: i64,
    same_pid_namespace: bool,
    expect: Option<String>,
    error: Option<String>,
    found_version: Option<u32>,
}

impl Manifest {
    fn parse(bytes: &[u8]) -> Manifest {
        let v: Value = serde_json::from_slice(bytes).unwrap();
        let text = |c: &Value, k: &str| c[k].as_str().map(str::to_owned);
        Manifest {
            now_mono_ns: v["now_mono_ns"].as_u64().unwrap(),
            placeholder_pid_ns: v["placeholder_pid_ns"].as_u64().unwrap(),
            freshness: Freshness {
                stale_after: Duration::from_millis(v["stale_after_ms"].as_u64().unwrap()),
                max_capture_age: Duration::from_millis(v["max_capture_age_ms"].as_u64().unwrap()),
            },
            cases: v["cases"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| Case {
                    name: text(c, "name").unwrap(),
                    kind: text(c, "kind").unwrap(),
                    file: text(c, "file").unwrap(),
                    engine_id: text(c, "engine_id").unwrap(),
                    key: text(c, "key").unwrap_or_default(),
                    pttl_ms: c["pttl_ms"].as_i64().unwrap_or(0),
                    same_pid_namespace: c["same_pid_namespace"].as_bool().unwrap_or(false),
                    expect: text(c, "expect"),
                    error: text(c, "error"),
                    found_version: c["found_version"].as_u64().map(|v| v as u32),
                })
                .collect(),
        }
    }
}

/// Reads a directory holding these shared-memory vectors, each under its
/// engine id, as `esdump` would at the manifest's `now_mono_ns`.
fn read_shm_dir(cases: &[(&Case, &Vec<u8>)], manifest: &Manifest) -> Reading {
    let dir = tempfile::tempdir().unwrap();
    for (case, bytes) in cases {
        let mut bytes = bytes.to_vec();
        if case.same_pid_namespace {
            assert_eq!(bytes[32..40], manifest.placeholder_pid_ns.to_le_bytes());
            bytes[32..40].copy_from_slice(&pid_namespace().to_le_bytes());
        }
        std::fs::write(dir.path().join(&case.engine_id), bytes).unwrap();
    }
    let options = ReaderOptions {
        freshness: manifest.freshness,
        ..ReaderOptions::default()
    };
    let mut source = ShmDir::open(dir.path(), options).unwrap();
    let mut reading = Reading::default();
    source.read_at(&mut reading, manifest.now_mono_ns).unwrap();
    reading
}

/// One fetch of a Redis vector, judged as the Redis source judges its first fetch.
fn read_redis(
    case: &Case,
    bytes: &[u8],
    freshness: &Freshness,
) -> Result<engine_state_reader::EngineState, Error> {
    state_at_fetch(
        Arc::from(case.engine_id.as_str()),
        &case.key,
        bytes,
        case.pttl_ms,
        freshness,
        0,
    )
    .map_err(Error::Redis)
}

/// The error class of a reader error (format/vectors/README.md), and the
/// version it names when it is about one.
fn class(error: &Error) -> (&'static str, Option<u32>) {
    match error {
        Error::Format(FormatError::NotEngineState { .. }) => ("not_engine_state", None),
        Error::Format(FormatError::UnknownVersion { found, .. }) => {
            ("unknown_version", Some(*found))
        }
        Error::Format(FormatError::WrongSize { .. }) => ("wrong_size", None),
        Error::Format(FormatError::CorruptHeader { .. }) => ("corrupt_header", None),
        Error::Format(FormatError::RefusedEntry { .. }) => ("refused_entry", None),
        Error::ClockAhead { .. } => ("clock_ahead", None),
        Error::Redis(RedisError::ForeignValue { .. }) => ("foreign_value", None),
        Error::Redis(RedisError::UnknownVersion { found, .. }) => ("unknown_version", Some(*found)),
        Error::Redis(RedisError::NoExpiry { .. }) => ("no_expiry", None),
        other => panic!("no vector error class for {other}"),
    }
}

/// The vector directories the generator owns.
const VECTOR_DIRS: [&str; 4] = ["shm", "redis", "cache", "routers"];

fn committed(file: &str) -> Vec<u8> {
    let path = vectors_dir().join(file);
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; regenerate with ENGINE_STATE_BLESS=1 cargo test -p engine-state-reader \
             --test golden_vectors",
            path.display()
        )
    })
}

#[test]
fn committed_vectors_are_what_the_writer_makes() {
    let generated = generate();
    if blessing() {
        for sub in VECTOR_DIRS {
            let _ = std::fs::remove_dir_all(vectors_dir().join(sub));
            std::fs::create_dir_all(vectors_dir().join(sub)).unwrap();
        }
        for (file, bytes) in &generated {
            std::fs::write(vectors_dir().join(file), bytes).unwrap();
        }
        eprintln!(
            "wrote {} files to {}",
            generated.len(),
            vectors_dir().display()
        );
        return;
    }
    for (file, bytes) in &generated {
        assert!(
            committed(file) == *bytes,
            "format/vectors/{file} differs from what the writer and reader make now. If the \
             format changed on purpose, regenerate with ENGINE_STATE_BLESS=1 cargo test -p \
             engine-state-reader --test golden_vectors, review the diff, and update \
             docs/FORMAT.md (a layout change bumps the layout version)"
        );
    }
    // No stale leftovers of removed cases.
    for sub in VECTOR_DIRS {
        for entry in std::fs::read_dir(vectors_dir().join(sub)).unwrap() {
            let name = format!("{sub}/{}", entry.unwrap().file_name().to_string_lossy());
            assert!(
                generated.contains_key(&name),
                "format/vectors/{name} is not a vector"
            );
        }
    }
}

#[test]
fn the_rust_reader_passes_every_committed_vector() {
    if blessing() {
        return; // the files are being rewritten by the test above
    }
    let manifest = Manifest::parse(&committed("manifest.json"));
    let classes: std::collections::BTreeSet<&str> = manifest
        .cases
        .iter()
        .filter_map(|c| c.error.as_deref())
        .collect();
    assert_eq!(
        classes.into_iter().collect::<Vec<_>>(),
        [
            "clock_ahead",
            "corrupt_header",
            "foreign_value",
            "no_expiry",
            "not_engine_state",
            "unknown_version",
            "wrong_size"
        ]
    );
    for case in &manifest.cases {
        let bytes = committed(&case.file);
        let result: Result<String, (&str, Option<u32>)> = match case.kind.as_str() {
            "shm" => {
                let reading = read_shm_dir(&[(case, &bytes)], &manifest);
                // The state says its stamp is ahead of the clock exactly when
                // the read reports it (the relay forwards the flag).
                let ahead_error = reading
                    .errors
                    .iter()
                    .any(|e| matches!(*e.error, Error::ClockAhead { .. }));
                for state in &reading.engines {
                    assert_eq!(state.clock_ahead, ahead_error, "{}", case.name);
                }
                match reading.errors.as_slice() {
                    [] => Ok(esdump_json(&reading.engines)),
                    [error] => {
                        assert_eq!(error.name, case.engine_id, "{}", case.name);
                        // An engine read besides its error (clock_ahead):
                        // its output is checked here, its class below.
                        match &case.expect {
                            Some(expect) => assert_eq!(
                                esdump_json(&reading.engines),
                                String::from_utf8(committed(expect)).unwrap(),
                                "{}",
                                case.name
                            ),
                            None => assert!(reading.engines.is_empty(), "{}", case.name),
                        }
                        Err(class(&error.error))
                    }
                    more => panic!("{}: {} errors", case.name, more.len()),
                }
            }
            "redis" => read_redis(case, &bytes, &manifest.freshness)
                .map(|state| esdump_json(&[state]))
                .map_err(|e| class(&e)),
            other => panic!("{}: unknown kind {other}", case.name),
        };
        match (&case.expect, &case.error, result) {
            (Some(expect), None, Ok(output)) => {
                assert_eq!(
                    output,
                    String::from_utf8(committed(expect)).unwrap(),
                    "{}",
                    case.name
                )
            }
            (_, Some(expected), Err((got, found))) => {
                assert_eq!(got, expected, "{}", case.name);
                assert_eq!(found, case.found_version, "{}", case.name);
            }
            (_, _, result) => panic!(
                "{}: expected {:?}/{:?}, got {result:?}",
                case.name, case.expect, case.error
            ),
        }
    }
}

#[test]
fn the_rust_reader_reads_the_whole_vector_directory_at_once() {
    if blessing() {
        return;
    }
    let manifest = Manifest::parse(&committed("manifest.json"));
    let files: Vec<(&Case, Vec<u8>)> = manifest
        .cases
        .iter()
        .filter(|c| c.kind == "shm")
        .map(|c| (c, committed(&c.file)))
        .collect();
    let cases: Vec<(&Case, &Vec<u8>)> = files.iter().map(|(c, b)| (*c, b)).collect();
    let reading = read_shm_dir(&cases, &manifest);
    assert_eq!(
        esdump_json(&reading.engines),
        String::from_utf8(committed("shm/all.json")).unwrap()
    );
    let mut failed: Vec<&str> = reading.errors.iter().map(|e| e.name.as_str()).collect();
    failed.sort_unstable();
    let mut expected: Vec<&str> = cases
        .iter()
        .filter(|(c, _)| c.error.is_some())
        .map(|(c, _)| c.engine_id.as_str())
        .collect();
    expected.sort_unstable();
    assert_eq!(failed, expected);
}

#[test]
fn the_rust_reader_passes_every_committed_cache_vector() {
    if blessing() {
        return;
    }
    let manifest: Value = serde_json::from_slice(&committed("manifest.json")).unwrap();
    let cases = manifest["cache_cases"].as_array().unwrap();
    let mut classes = std::collections::BTreeSet::new();
    for case in cases {
        let text = |k: &str| case[k].as_str().unwrap_or_else(|| panic!("{case}: {k}"));
        let (name, kind) = (text("name"), text("kind"));
        let bytes = committed(text("file"));
        match (
            cache::read_case(kind, text("engine_id"), &bytes),
            case.get("expect"),
        ) {
            (Ok(output), Some(expect)) => {
                let expected = committed(expect.as_str().unwrap());
                assert_eq!(output.as_bytes(), expected, "{name}");
                let digest: Value = serde_json::from_str(&output).unwrap();
                assert_eq!(digest["generation"], case["generation"], "{name}");
            }
            (Err((class, found)), None) => {
                assert_eq!(class, text("error"), "{name}");
                assert_eq!(
                    found.map(u64::from),
                    case["found_version"].as_u64(),
                    "{name}"
                );
                classes.insert(class);
            }
            (got, _) => panic!("{name}: got {got:?}, manifest {case}"),
        }
    }
    assert_eq!(
        classes.into_iter().collect::<Vec<_>>(),
        [
            "corrupt_cache",
            "not_digest",
            "torn",
            "unknown_version",
            "wrong_size"
        ],
        "every digest error class has a vector"
    );
    assert!(cases.len() >= 20, "{} cache cases", cases.len());
}

#[test]
fn the_rust_reader_passes_every_committed_router_vector() {
    if blessing() {
        return;
    }
    let manifest: Value = serde_json::from_slice(&committed("manifest.json")).unwrap();
    let cases = manifest["router_cases"].as_array().unwrap();
    let mut classes = std::collections::BTreeSet::new();
    for case in cases {
        let text = |k: &str| case[k].as_str().unwrap_or_else(|| panic!("{case}: {k}"));
        let name = text("name");
        assert_eq!(text("kind"), "router_file", "{name}");
        let bytes = committed(text("file"));
        match (
            routers::read_case(text("replica_id"), &bytes),
            case.get("expect"),
        ) {
            (Ok(output), Some(expect)) => {
                let expected = committed(expect.as_str().unwrap());
                assert_eq!(output.as_bytes(), expected, "{name}");
            }
            (Err((class, found)), None) => {
                assert_eq!(class, text("error"), "{name}");
                assert_eq!(
                    found.map(u64::from),
                    case["found_version"].as_u64(),
                    "{name}"
                );
                classes.insert(class);
            }
            (got, _) => panic!("{name}: got {got:?}, manifest {case}"),
        }
    }
    assert_eq!(
        classes.into_iter().collect::<Vec<_>>(),
        [
            "corrupt_router",
            "not_router",
            "torn",
            "unknown_version",
            "wrong_size"
        ],
        "every router error class has a vector"
    );
}

#[test]
fn the_block_hash_vector_is_the_router_hash() {
    if blessing() {
        return;
    }
    let manifest: Value = serde_json::from_slice(&committed("manifest.json")).unwrap();
    let vector: Value =
        serde_json::from_slice(&committed(manifest["block_hashes"].as_str().unwrap())).unwrap();
    assert_eq!(
        vector["block_tokens"].as_u64(),
        Some(engine_state_shm_format::blocks::BLOCK_TOKENS as u64)
    );
    let cases = vector["cases"].as_array().unwrap();
    assert!(cases.len() >= 5);
    for case in cases {
        let tokens: Vec<u32> = serde_json::from_value(case["tokens"].clone()).unwrap();
        let hashes: Vec<u64> = serde_json::from_value(case["hashes"].clone()).unwrap();
        assert_eq!(
            engine_state_shm_format::blocks::block_hashes(&tokens),
            hashes,
            "{}",
            case["name"]
        );
        assert_eq!(hashes.len(), tokens.len() / 512, "{}", case["name"]);
    }
    // The shared first block hashes alike: the chain is over prefixes.
    let by_name = |n: &str| cases.iter().find(|c| c["name"] == n).unwrap()["hashes"][0].clone();
    assert_eq!(by_name("zeros"), by_name("shares_first_block"));
}
