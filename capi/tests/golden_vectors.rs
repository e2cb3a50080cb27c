//! The golden vectors of `format/vectors/` (its README.md) read through the
//! C ABI — only the `extern "C"` functions, as a C program calls them:
//! every shared-memory case alone and all of them in one directory with
//! `es_read_at` at the manifest's `now_mono_ns`, and every Redis record with
//! `es_decode_record`. Outputs are rebuilt from the `EsEngine` fields into the
//! reader's `EngineState`, printed in its `esdump --json` shape, and compared byte for byte; errors by class.

use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};

use engine_state::{
    es_close, es_engine_error, es_error_count, es_last_error, es_open, es_options_init_sized,
    es_read_at, EsCode, EsEngine, EsOptions, EsSource, EsStatus,
};
use std::time::Duration;

use engine_state_reader::{EngineState, Status};
use serde_json::Value;

fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../format/vectors")
}

fn committed(file: &str) -> Vec<u8> {
    std::fs::read(vectors_dir().join(file)).unwrap()
}

/// The C struct back as the reader's `EngineState`, from its fields only:
/// the `esdump --json` shape is the reader's (`Serialize for EngineState`),
/// so what is compared is what the C fields carry.
fn engine_state(e: &EsEngine) -> EngineState {
    let state = EngineState {
        engine_id: e.engine_id().into(),
        status: match e.status {
            EsStatus::Fresh => Status::Fresh,
            EsStatus::Stale => Status::Stale,
            EsStatus::Dead => Status::Dead,
            EsStatus::Torn => Status::Torn,
        },
        snapshot: bytemuck::cast(e.snapshot),
        heartbeat_age: Duration::from_nanos(e.heartbeat_age_ns),
        capture_age: Duration::from_nanos(e.capture_age_ns),
        generation: e.generation,
        read_mono_ns: e.read_mono_ns,
        writer: Default::default(),
        clock_ahead: false,
        cache: None,
    };
    // The one field the JSON derives rather than copies: the C struct's own.
    assert_eq!(
        e.gpu_kv_used_frac,
        state.gpu_kv_used_frac().unwrap_or(-1.0),
        "{}",
        e.engine_id()
    );
    state
}

fn esdump_json(engines: &[EsEngine]) -> String {
    let json: Vec<EngineState> = engines.iter().map(engine_state).collect();
    serde_json::to_string_pretty(&json).unwrap() + "\n"
}

/// The vector class of a per-engine code (format/vectors/README.md).
fn class(code: EsCode) -> &'static str {
    match code {
        EsCode::NotEngineState => "not_engine_state",
        EsCode::UnknownVersion => "unknown_version",
        EsCode::WrongSize => "wrong_size",
        EsCode::CorruptHeader => "corrupt_header",
        EsCode::ForeignValue => "foreign_value",
        EsCode::NoExpiry => "no_expiry",
        EsCode::ClockAhead => "clock_ahead",
        other => panic!("{other:?} is no vector class"),
    }
}

fn last_error() -> String {
    let mut buf = [0 as c_char; 1024];
    // SAFETY: a 1024-byte buffer.
    unsafe { es_last_error(buf.as_mut_ptr(), buf.len()) };
    // SAFETY: NUL-terminated by es_last_error.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

struct Manifest {
    now_mono_ns: u64,
    placeholder_pid_ns: u64,
    options: EsOptions,
    cases: Vec<Value>,
}

fn manifest() -> Manifest {
    let v: Value = serde_json::from_slice(&committed("manifest.json")).unwrap();
    let mut options = EsOptions::default();
    // SAFETY: a writable EsOptions of its size.
    let code = unsafe { es_options_init_sized(&mut options, std::mem::size_of::<EsOptions>()) };
    assert_eq!(code, EsCode::Ok);
    options.stale_after_ns = v["stale_after_ms"].as_u64().unwrap() * 1_000_000;
    options.max_capture_age_ns = v["max_capture_age_ms"].as_u64().unwrap() * 1_000_000;
    Manifest {
        now_mono_ns: v["now_mono_ns"].as_u64().unwrap(),
        placeholder_pid_ns: v["placeholder_pid_ns"].as_u64().unwrap(),
        options,
        cases: v["cases"].as_array().unwrap().clone(),
    }
}

/// A per-engine error: the engine it names, its code and message.
struct EngineError {
    name: String,
    code: EsCode,
    message: String,
}

/// Writes these shm cases into one directory and reads it through the ABI.
fn read_shm(cases: &[&Value], manifest: &Manifest) -> (Vec<EsEngine>, Vec<EngineError>) {
    let dir = tempfile::tempdir().unwrap();
    for case in cases {
        let mut bytes = committed(case["file"].as_str().unwrap());
        if case["same_pid_namespace"].as_bool().unwrap() {
            assert_eq!(bytes[32..40], manifest.placeholder_pid_ns.to_le_bytes());
            let own = engine_state_shm_format::pid_namespace();
            bytes[32..40].copy_from_slice(&own.to_le_bytes());
        }
        let id = case["engine_id"].as_str().unwrap();
        std::fs::write(dir.path().join(id), bytes).unwrap();
    }
    let uri = CString::new(format!("file://{}", dir.path().display())).unwrap();
    let mut source: *mut EsSource = std::ptr::null_mut();
    // SAFETY: a C string, whole options, a writable out-pointer.
    let code = unsafe { es_open(uri.as_ptr(), &manifest.options, &mut source) };
    assert_eq!(code, EsCode::Ok, "{}", last_error());
    let mut engines = vec![EsEngine::default(); cases.len()];
    let mut count = usize::MAX;
    // SAFETY: a live handle, an array of `cases.len()` engines, a count.
    let code = unsafe {
        es_read_at(
            source,
            manifest.now_mono_ns,
            engines.as_mut_ptr(),
            engines.len(),
            &mut count,
        )
    };
    assert_eq!(code, EsCode::Ok, "{}", last_error());
    engines.truncate(count);
    let mut n_errors = usize::MAX;
    // SAFETY: a live handle and a count.
    assert_eq!(unsafe { es_error_count(source, &mut n_errors) }, EsCode::Ok);
    let errors = (0..n_errors)
        .map(|i| {
            let mut code = EsCode::Ok;
            let mut name = [0 as c_char; 256];
            let mut message = [0 as c_char; 2048];
            // SAFETY: a live handle, a writable code, two buffers of their sizes.
            let result = unsafe {
                es_engine_error(
                    source,
                    i,
                    &mut code,
                    name.as_mut_ptr(),
                    name.len(),
                    message.as_mut_ptr(),
                    message.len(),
                )
            };
            assert_eq!(result, EsCode::Ok, "{}", last_error());
            let text = |b: &[c_char]| {
                // SAFETY: both NUL-terminated by es_engine_error.
                unsafe { CStr::from_ptr(b.as_ptr()) }
                    .to_str()
                    .unwrap()
                    .to_owned()
            };
            EngineError {
                name: text(&name),
                code,
                message: text(&message),
            }
        })
        .collect();
    // SAFETY: the handle from es_open, closed once.
    unsafe { es_close(source) };
    (engines, errors)
}

#[test]
fn the_c_abi_passes_every_shared_memory_vector() {
    let manifest = manifest();
    let mut checked = 0;
    for case in manifest.cases.iter().filter(|c| c["kind"] == "shm") {
        let name = case["name"].as_str().unwrap();
        let (engines, errors) = read_shm(&[case], &manifest);
        match (case["expect"].as_str(), case["error"].as_str()) {
            (Some(expect), None) => {
                assert!(errors.is_empty(), "{name}: {}", errors[0].message);
                let expected = String::from_utf8(committed(expect)).unwrap();
                assert_eq!(esdump_json(&engines), expected, "{name}");
            }
            (expect, Some(expected_class)) => {
                // An engine read besides its error (clock_ahead).
                match expect {
                    Some(expect) => assert_eq!(
                        esdump_json(&engines),
                        String::from_utf8(committed(expect)).unwrap(),
                        "{name}"
                    ),
                    None => assert!(engines.is_empty(), "{name}"),
                }
                let [error] = errors.as_slice() else {
                    panic!("{name}: {} errors", errors.len())
                };
                assert_eq!(class(error.code), expected_class, "{name}");
                assert_eq!(error.name, case["engine_id"].as_str().unwrap());
                if let Some(found) = case["found_version"].as_u64() {
                    assert!(
                        error.message.contains(&format!("version {found}")),
                        "{name}: {}",
                        error.message
                    );
                }
            }
            other => panic!("{name}: {other:?}"),
        }
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} shm cases");
}

#[test]
fn the_c_abi_reads_the_whole_vector_directory_at_once() {
    let manifest = manifest();
    let cases: Vec<&Value> = manifest
        .cases
        .iter()
        .filter(|c| c["kind"] == "shm")
        .collect();
    let (engines, errors) = read_shm(&cases, &manifest);
    assert_eq!(
        esdump_json(&engines),
        String::from_utf8(committed("shm/all.json")).unwrap()
    );
    let mut failed: Vec<&str> = errors.iter().map(|e| e.name.as_str()).collect();
    failed.sort_unstable();
    let mut expected: Vec<&str> = cases
        .iter()
        .filter(|c| c["error"].is_string())
        .map(|c| c["engine_id"].as_str().unwrap())
        .collect();
    expected.sort_unstable();
    assert_eq!(failed, expected);
}

#[test]
#[cfg(feature = "redis")] // es_decode_record is ES_CODE_UNSUPPORTED without it
fn the_c_abi_passes_every_redis_vector() {
    use engine_state::es_decode_record;

    let manifest = manifest();
    let mut checked = 0;
    for case in manifest.cases.iter().filter(|c| c["kind"] == "redis") {
        let name = case["name"].as_str().unwrap();
        let bytes = committed(case["file"].as_str().unwrap());
        let key = CString::new(case["key"].as_str().unwrap()).unwrap();
        let id = CString::new(case["engine_id"].as_str().unwrap()).unwrap();
        let mut engine = EsEngine::default();
        // SAFETY: C strings, `bytes.len()` readable bytes, whole options, a writable engine.
        let code = unsafe {
            es_decode_record(
                key.as_ptr(),
                id.as_ptr(),
                bytes.as_ptr(),
                bytes.len(),
                case["pttl_ms"].as_i64().unwrap(),
                &manifest.options,
                &mut engine,
            )
        };
        match (case["expect"].as_str(), case["error"].as_str()) {
            (Some(expect), None) => {
                assert_eq!(code, EsCode::Ok, "{name}: {}", last_error());
                let expected = String::from_utf8(committed(expect)).unwrap();
                assert_eq!(esdump_json(&[engine]), expected, "{name}");
            }
            (None, Some(expected_class)) => {
                assert_eq!(class(code), expected_class, "{name}");
                let message = last_error();
                assert!(message.contains(case["key"].as_str().unwrap()), "{message}");
                if let Some(found) = case["found_version"].as_u64() {
                    assert!(message.contains(&format!("version {found}")), "{message}");
                }
            }
            other => panic!("{name}: {other:?}"),
        }
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} redis cases");
}
