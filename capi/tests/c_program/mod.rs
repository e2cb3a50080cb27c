//! What the tests that run a real C program share (`tests/c_cache.rs`,
//! `tests/c_routers.rs`): the vectors, building one C file against the
//! static library under ASan and UBSan, running it.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// `format/vectors/`.
pub fn vectors() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../format/vectors")
}

/// The JSON file of `format/vectors/` that `case[field]` names (a case's
/// `expect`).
pub fn vector_json(case: &Value, field: &str) -> Value {
    let path = vectors().join(case[field].as_str().unwrap());
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// What the C programs print for a failed call of error class `class`
/// (a vector's `error`, e.g. `not_router`).
pub fn code_line(class: &str) -> String {
    format!("code ES_CODE_{}", class.to_uppercase())
}

/// Builds one C file of this repository (`source`, from `capi/`) into a
/// fresh directory as `name`; the static library is the one cargo built
/// for this test (next to the test binary, in `deps`).
pub fn build_c(source: &str, name: &str) -> (tempfile::TempDir, PathBuf) {
    let deps = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_owned();
    let lib = deps.join("libengine_state.a");
    assert!(lib.exists(), "{} missing", lib.display());
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = tempfile::tempdir().unwrap();
    let exe = out.path().join(name);
    let status = Command::new("cc")
        .args(["-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror"])
        .args(["-fsanitize=address,undefined", "-fno-sanitize-recover=all"])
        .arg("-I")
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join(source))
        .arg(&lib)
        .args([
            "-lgcc_s",
            "-lutil",
            "-lrt",
            "-lpthread",
            "-lm",
            "-ldl",
            "-o",
        ])
        .arg(&exe)
        .status()
        .expect("cc (the system C compiler) is needed");
    assert!(status.success(), "cc failed");
    (out, exe)
}

/// Runs `exe` with `args` (leaks detected, any sanitizer report fails) and
/// returns its output's lines; a failed run fails the test.
pub fn run_c(exe: &Path, args: &[&str]) -> Vec<String> {
    let out = Command::new(exe)
        .args(args)
        .env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{} {args:?}: {:?} {}",
        exe.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}
