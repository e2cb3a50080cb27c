//! The cache vectors read by a real C program (`tests/c/cache_read.c`,
//! built with the system compiler against the static library under ASan
//! and UBSan, as `make test-capi` builds the examples): every digest
//! vector's entries or class, and `block_hashes.json`.

mod c_program;

use std::path::{Path, PathBuf};
use std::process::Command;

use c_program::{build_c, code_line, run_c, vector_json, vectors};

use serde_json::Value;

/// Builds the C program.
fn build() -> (tempfile::TempDir, PathBuf) {
    build_c("tests/c/cache_read.c", "cache_read")
}

fn run(exe: &Path, mode: &str, path: &Path) -> Vec<String> {
    run_c(exe, &[mode, path.to_str().unwrap()])
}

fn hex(values: &Value) -> Vec<String> {
    values
        .as_array()
        .unwrap()
        .iter()
        .map(|v| format!("{:016x}", v.as_u64().unwrap()))
        .collect()
}

#[test]
fn a_c_program_reads_every_cache_vector_and_reproduces_block_hashes() {
    let (tmp, exe) = build();
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(vectors().join("manifest.json")).unwrap()).unwrap();
    for case in manifest["cache_cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let mode = if case["kind"] == "cache_file" {
            "file"
        } else {
            "value"
        };
        let lines = run(&exe, mode, &vectors().join(case["file"].as_str().unwrap()));
        match case["error"].as_str() {
            Some(error) => {
                assert_eq!(lines, [code_line(error)], "{name}")
            }
            None => {
                let e: Value = vector_json(case, "expect");
                let state = if e["state"] == "active" { 1 } else { 2 };
                let mut expected = vec![
                    "code ES_CODE_OK".to_owned(),
                    format!(
                        "digest {} {} {} {} {state} {}",
                        e["version"], e["count"], e["held"], e["capacity"], e["generation"]
                    ),
                ];
                expected.extend(hex(&e["blocks"]));
                assert_eq!(lines, expected, "{name}");
            }
        }
    }
    let file = manifest["block_hashes"].as_str().unwrap();
    let v: Value = serde_json::from_slice(&std::fs::read(vectors().join(file)).unwrap()).unwrap();
    for case in v["cases"].as_array().unwrap() {
        let tokens: Vec<u8> = case["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|t| (t.as_u64().unwrap() as u32).to_ne_bytes())
            .collect();
        let path = tmp.path().join("tokens");
        std::fs::write(&path, tokens).unwrap();
        let mut expected = vec!["code ES_CODE_OK".to_owned()];
        expected.extend(hex(&case["hashes"]));
        assert_eq!(run(&exe, "hashes", &path), expected, "{}", case["name"]);
    }
}

/// A digest a Rust writer publishes in a live directory, read by the C
/// example (`examples/c/esdump.c --cache ENGINE`, es_read_cache).
#[test]
fn the_c_example_reads_a_live_digest_with_es_read_cache() {
    use engine_state_shm_format::{
        monotonic_ns, CacheDigest, DigestOptions, DigestWriter, EngineId, ShmWriter, Snapshot,
        WriterOptions,
    };
    let (_out, exe) = build_c("../examples/c/esdump.c", "esdump-c");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("engines");
    std::fs::create_dir(&dir).unwrap();
    let id = EngineId::new("live").unwrap();
    let mut engine =
        ShmWriter::create(&dir, &id, &WriterOptions::default(), &Snapshot::default()).unwrap();
    let options = DigestOptions {
        capacity: 4,
        generation: engine.generation(),
        ..DigestOptions::default()
    };
    let digest = CacheDigest::new(2, monotonic_ns(), vec![0xbeef, 0x1]);
    let _digest = DigestWriter::create(&dir, &id, &options, &digest, 2, 0).unwrap();
    engine
        .publish(&Snapshot {
            captured_mono_ns: monotonic_ns(),
            cache_blocks: 2,
            cache_version: 2,
            ..Snapshot::default()
        })
        .unwrap();
    let uri = format!("file://{}", dir.display());
    let out = Command::new(&exe)
        .args(["--cache", "live", &uri])
        .env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    let header = format!(
        "live version 2 count 2 generation {} fresh",
        engine.generation()
    );
    assert_eq!(
        lines,
        [header.as_str(), "0000000000000001", "000000000000beef"]
    );
    // An engine that is not there: status 1 and the code.
    let out = Command::new(&exe)
        .args(["--cache", "gone", &uri])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("ES_CODE_NOT_FOUND"));
}
