//! Bad files, ids and directories: each gets a clear error, nothing panics,
//! the healthy engines are still read.

use std::process::{Command, Stdio};

use engine_state_shm_format::{layout::ENGINE_ID_OFFSET, FILE_SIZE};
use engine_state_tests::*;

/// An espublish process, returned once its first snapshot is published
/// (it prints its "publishing" line after the first publish).
fn espublish(uri: &str, id: &str) -> Proc {
    let mut proc = Proc::spawn(
        Command::new(bin("espublish"))
            .args([
                "--engine-id",
                id,
                "--uri",
                uri,
                "--set",
                "num_running=5",
                "--duration",
                "60",
            ])
            .stdout(Stdio::piped()),
    );
    let line = proc.first_line();
    assert!(
        line.contains("publishing"),
        "espublish did not start: {line:?}"
    );
    proc
}

#[test]
fn corrupt_and_foreign_files_do_not_stop_healthy_engines() {
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", dir.path().display());
    let _a = espublish(&uri, "healthy-a");
    let _b = espublish(&uri, "healthy-b");
    let good = std::fs::read(dir.path().join("healthy-a")).unwrap();
    let write = |name: &str, bytes: &[u8]| std::fs::write(dir.path().join(name), bytes).unwrap();
    let mut wrong_magic = good.clone();
    wrong_magic[0] = b'X';
    let mut wrong_version = good.clone();
    wrong_version[8] = 9;
    let mut wrong_id = good.clone();
    wrong_id[ENGINE_ID_OFFSET..ENGINE_ID_OFFSET + 9].copy_from_slice(b"../escape");
    write("truncated", &good[..100]);
    write("wrong-magic", &wrong_magic);
    write("wrong-version", &wrong_version);
    write("wrong-id", &wrong_id);
    write("notes.txt", b"unrelated file\n");
    write("empty", b"");
    write("huge", &vec![0u8; FILE_SIZE * 3]);

    let out = Command::new(bin("esdump"))
        .args(["--json", "--uri", &uri])
        .output()
        .unwrap();
    assert!(out.status.success());
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<&str> = value
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["engine_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["healthy-a", "healthy-b"]);
    assert!(value
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["num_running"] == 5));
    let stderr = String::from_utf8(out.stderr).unwrap();
    for (name, says) in [
        (
            "truncated",
            "is 100 bytes, but an engine-state file is 4096 bytes",
        ),
        ("wrong-magic", "is not an engine-state file"),
        (
            "wrong-version",
            "layout version 9, but this build reads version 1",
        ),
        ("wrong-id", "corrupt header"),
        ("notes.txt", "not an engine-state file"),
        ("empty", "is 0 bytes"),
        ("huge", "not an engine-state file"),
    ] {
        let line = stderr
            .lines()
            .find(|l| l.contains(&format!("/{name} ")))
            .unwrap_or_else(|| {
                panic!("no error for {name} in:\n{stderr}");
            });
        assert!(line.contains(says), "{name}: {line}");
    }
    assert!(!stderr.contains("panicked"));

    // The table shows the same, errors below the rows.
    let out = Command::new(bin("esdump"))
        .args(["--uri", &uri])
        .output()
        .unwrap();
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        table.lines().nth(1).unwrap().starts_with("healthy-a"),
        "{table}"
    );
    assert_eq!(
        table.lines().filter(|l| l.starts_with("! ")).count(),
        7,
        "{table}"
    );
}

#[test]
fn invalid_engine_ids_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", dir.path().display());
    let long = "x".repeat(64);
    for (id, says) in [
        ("../x", "characters outside"),
        ("", "empty"),
        (long.as_str(), "longer than 63"),
    ] {
        let out = Command::new(bin("espublish"))
            .args(["--engine-id", id, "--uri", &uri, "--duration", "0"])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(
            stderr.contains("invalid engine id") && stderr.contains(says),
            "{id:?}: {stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing was created"
    );
}

#[test]
fn second_live_publisher_with_the_same_id_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", dir.path().display());
    let _first = espublish(&uri, "same");
    let out = Command::new(bin("espublish"))
        .args(["--engine-id", "same", "--uri", &uri, "--duration", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("already published by a live process"),
        "{stderr}"
    );
}

#[test]
fn unusable_directories_and_uris_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain");
    std::fs::write(&file, b"").unwrap();
    let file_uri = format!("file://{}", file.display());
    let below_file_uri = format!("file://{}/sub", file.display());
    let cases = [
        (
            vec!["esdump", "--uri", "file:///nonexistent/engine-state"],
            "cannot read engine-state directory",
        ),
        (vec!["esdump", "--uri", "ftp://x"], "bad engine-state URI"),
        // An unknown --sort column names the valid ones, before any read.
        (
            vec!["esdump", "--sort", "queue", "--uri", "ftp://x"],
            "--sort: unknown column \"queue\"; the columns are: ENGINE, STATUS, STEP, RUN",
        ),
        // A newline in the URI is escaped: still one line (docs/FORMAT.md).
        (
            vec!["esdump", "--uri", "ftp://a\nb"],
            "bad engine-state URI",
        ),
        (
            vec!["esdump", "--uri", "file:///nonexistent/a\nb"],
            "cannot read engine-state directory",
        ),
        (
            vec!["esdump", "--uri", &file_uri],
            "cannot read engine-state directory",
        ),
        (
            vec![
                "espublish",
                "--engine-id",
                "e",
                "--duration",
                "0",
                "--uri",
                &below_file_uri,
            ],
            "cannot create the engine-state directory",
        ),
    ];
    for (argv, says) in cases {
        let out = Command::new(bin(argv[0]))
            .args(&argv[1..])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{argv:?}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(stderr.contains(says), "{argv:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{argv:?}: {stderr}");
    }
}

/// The table's options do not apply to `--json` (whose output other tools,
/// esdump-go's diff among them, compare byte for byte): refused, not ignored.
#[test]
fn table_options_are_refused_with_json() {
    for option in [&["--wide"][..], &["--sort", "run"], &["--filter", "e"]] {
        let out = Command::new(bin("esdump"))
            .arg("--json")
            .args(option)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{option:?}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(
            stderr.contains("cannot be used with"),
            "{option:?}: {stderr}"
        );
    }
}

/// A directory the publisher may not write into. Root ignores permission
/// bits, so as root the publisher runs as `nobody` (via setpriv).
#[test]
fn unwritable_directory_is_a_clear_error() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let locked = dir.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o555)).unwrap();
    let uri = format!("file://{}", locked.display());
    let args = ["--engine-id", "e", "--duration", "0", "--uri", uri.as_str()];
    let mut command = if nix::unistd::geteuid().is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(bin("espublish"));
        c
    } else {
        Command::new(bin("espublish"))
    };
    let out = command
        .args(args)
        .output()
        .expect("setpriv (util-linux) runs the publisher as nobody");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("Permission denied")
            && stderr.contains("run as a user that may write there"),
        "{stderr}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert_eq!(std::fs::read_dir(&locked).unwrap().count(), 0);
}

/// A file named with a terminal escape and a newline: esdump shows the name
/// escaped, in the table and in --json's error lines, so it cannot recolour
/// the terminal or forge a row; the JSON itself stays valid.
#[test]
fn esdump_escapes_terminal_controls_in_file_names() {
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", dir.path().display());
    let _healthy = espublish(&uri, "healthy");
    std::fs::write(dir.path().join("ev\x1b[31mil\nforged-row"), b"x").unwrap();

    let out = Command::new(bin("esdump"))
        .args(["--uri", &uri])
        .output()
        .unwrap();
    assert!(out.status.success());
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(!table.contains('\x1b'), "{table:?}");
    assert!(
        !table.lines().any(|l| l.starts_with("forged-row")),
        "{table}"
    );
    let errors: Vec<&str> = table.lines().filter(|l| l.starts_with("! ")).collect();
    assert_eq!(errors.len(), 1, "{table}");
    assert!(
        errors[0].starts_with(r"! ev\u{1b}[31mil\nforged-row: "),
        "{}",
        errors[0]
    );
    assert!(
        table.lines().nth(1).unwrap().starts_with("healthy"),
        "{table}"
    );

    let (json, stderr) = esdump_json(&uri);
    assert_eq!(json.as_array().unwrap().len(), 1, "{json}");
    assert!(!stderr.contains('\x1b'), "{stderr:?}");
    assert_eq!(stderr.lines().count(), 1, "one error line: {stderr}");
    assert!(stderr.contains(r"ev\u{1b}[31mil\nforged-row"), "{stderr}");
}

/// SIGTERM and SIGINT stop espublish like the end of `--duration`: the file
/// is retired and removed, not left behind as a dead writer's file.
#[test]
fn espublish_removes_its_file_on_sigterm_and_sigint() {
    use nix::sys::signal::{kill, Signal};
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", dir.path().display());
    for (id, signal) in [("term", Signal::SIGTERM), ("int", Signal::SIGINT)] {
        let mut publisher = espublish(&uri, id);
        assert!(dir.path().join(id).exists());
        kill(publisher.pid(), signal).unwrap();
        let status = publisher.0.wait().unwrap();
        assert!(status.success(), "{signal}: {status:?}");
        assert!(!dir.path().join(id).exists(), "{signal} left the file");
    }
    let mut stress = Proc::spawn(
        Command::new(bin("espublish"))
            .args(["--engine-id", "stress", "--uri", &uri, "--stress"])
            .stdout(Stdio::piped()),
    );
    assert!(stress.first_line().contains("stress-writing"));
    kill(stress.pid(), Signal::SIGTERM).unwrap();
    assert!(stress.0.wait().unwrap().success());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// `--duration` beyond what a `Duration` holds was a panic (exit 101): now
/// a clear error, like every other bad value.
#[test]
fn espublish_refuses_durations_it_cannot_represent() {
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", dir.path().display());
    for duration in ["1e20", "inf", "NaN"] {
        let out = Command::new(bin("espublish"))
            .args(["--uri", &uri, "--engine-id", "d", "--duration", duration])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{duration}: {stderr}");
        assert!(
            stderr.contains("must be a number of seconds in 0..="),
            "{stderr}"
        );
    }
}

/// An environment variable set to bytes that are not UTF-8 is an error the
/// binaries exit with, never taken for unset (the default id or directory).
#[test]
fn environment_values_that_are_not_utf8_are_errors_not_defaults() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", dir.path().display());
    let not_utf8 = std::ffi::OsStr::from_bytes(b"w\xff1");
    let espublish = Command::new(bin("espublish"))
        .args(["--uri", &uri, "--duration", "0.2"])
        .env("AGENTIC_WORKER_ID", not_utf8)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&espublish.stderr);
    assert_eq!(espublish.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(r#"AGENTIC_WORKER_ID="w\xff1" is not UTF-8: set it to a UTF-8 value"#),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing published"
    );
    let esdump = Command::new(bin("esdump"))
        .env(
            "AGENTIC_ENGINE_STATE_URI",
            std::ffi::OsStr::from_bytes(b"file:///d\xfe?token=t"),
        )
        .output()
        .unwrap();
    // The shared --uri flag reads the variable through clap, which refuses it.
    let stderr = String::from_utf8_lossy(&esdump.stderr);
    assert_eq!(esdump.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("invalid UTF-8"), "{stderr}");
    assert!(!stderr.contains("token=t"), "{stderr}");
}
