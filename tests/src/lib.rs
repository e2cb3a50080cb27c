//! Helpers for the cross-process tests in `tests/`: where the binaries and the
//! Python interpreter with `engine_state` installed are, child processes
//! that are killed when a test ends, a real [`RedisServer`] on a free port,
//! and esagent in-process ([`InProcessAgent`]) or as a process.
//!
//! `make test` builds the binaries (`cargo build --bins`) and the Python
//! package (`maturin develop` into `.venv`) before running these tests.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

mod agent;
mod redis_server;

pub use crate::agent::{esagent_process, http_get, sample, stderr_of, InProcessAgent};
pub use crate::redis_server::{free_port, redis_server_path, RedisServer};

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace")
        .to_owned()
}

/// Path of a workspace binary built in the same profile as this test.
pub fn bin(name: &str) -> PathBuf {
    // target/<profile>/deps/<test-exe> → target/<profile>/<name>
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let path = profile_dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the binaries first (`cargo build --bins` in the same profile; `make test` does)",
        path.display()
    );
    path
}

/// The Python interpreter that has `engine_state` installed:
/// `$ENGINE_STATE_PYTHON`, else `<workspace>/.venv/bin/python`.
pub fn python() -> PathBuf {
    let path = std::env::var_os("ENGINE_STATE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(".venv/bin/python"));
    assert!(
        path.exists(),
        "{} is missing: create the venv with the engine_state package (`make py`; `make test` does)",
        path.display()
    );
    path
}

/// A child process killed (SIGKILL) and reaped when dropped.
#[derive(Debug)]
pub struct Proc(pub Child);

impl Proc {
    /// Spawns `command` with stdin piped (closing it tells the Python helpers to exit).
    pub fn spawn(command: &mut Command) -> Proc {
        Proc(
            command
                .stdin(Stdio::piped())
                .spawn()
                .expect("spawn child process"),
        )
    }

    /// The first line the child printed on its stdout (spawned piped);
    /// waits for it. The pipe is closed afterwards.
    pub fn first_line(&mut self) -> String {
        let stdout = self.0.stdout.take().expect("a piped stdout");
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
            .expect("read the child's stdout");
        line
    }

    /// The child's pid.
    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.0.id() as i32)
    }

    /// Sends SIGKILL and waits for the child to be gone.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The publish (and heartbeat) period of [`python_publisher`]'s publisher.
pub const PYTHON_PUBLISH_PERIOD: Duration = Duration::from_millis(20);

/// A Python publisher in its own process: runs `body` after
/// `from engine_state import Publisher` with `pub = Publisher(uri=…, engine_id=…)`
/// created (period [`PYTHON_PUBLISH_PERIOD`]), then waits until its stdin closes.
pub fn python_publisher(dir: &Path, engine_id: &str, body: &str) -> Proc {
    python_publisher_at(&format!("file://{}", dir.display()), engine_id, body)
}

/// [`python_publisher`] for any URI (e.g. `redis://…`).
pub fn python_publisher_at(uri: &str, engine_id: &str, body: &str) -> Proc {
    let script = format!(
        "import sys\nfrom engine_state import Publisher\n\
         pub = Publisher(uri={uri:?}, engine_id={engine_id:?}, period_ms={period_ms})\n{body}\n\
         sys.stdout.write('ready\\n'); sys.stdout.flush()\nsys.stdin.read()\n",
        period_ms = PYTHON_PUBLISH_PERIOD.as_millis()
    );
    let mut proc = Proc::spawn(
        Command::new(python())
            .arg("-c")
            .arg(script)
            .stdout(Stdio::piped()),
    );
    let line = proc.first_line();
    assert_eq!(
        line, "ready\n",
        "the Python publisher did not start (its stderr is above)"
    );
    proc
}

/// `esdump --json --uri <uri>`, asserted to succeed: its JSON and its stderr.
pub fn esdump_json(uri: &str) -> (serde_json::Value, String) {
    let out = Command::new(bin("esdump"))
        .args(["--json", "--uri", uri])
        .output()
        .expect("run esdump");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "esdump --json failed: {stderr}");
    let json = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("esdump printed no JSON ({e}): {stderr}"));
    (json, stderr)
}

/// What parsing `uri` shows, for tests that no output leaks a credential:
/// `("StateUri", Display and Debug)` when it parses, else
/// `("StateUri::parse", the error's Display and Debug)`.
pub fn parsed_uri_text(uri: &str) -> (&'static str, String) {
    match engine_state_reader::StateUri::parse(uri) {
        Ok(parsed) => ("StateUri", format!("{parsed} {parsed:?}")),
        Err(e) => ("StateUri::parse", format!("{e} {e:?}")),
    }
}

/// Waits (as [`wait_for`]) until `source` reads engine `id` in a state that
/// passes `test`, and returns that state (assert on it, not on a read after
/// the wait, which may see a newer heartbeat or snapshot).
pub fn wait_for_engine(
    source: &mut dyn engine_state_reader::Source,
    id: &str,
    what: &str,
    test: impl Fn(&engine_state_reader::EngineState) -> bool,
) -> engine_state_reader::EngineState {
    let mut passed = None;
    wait_for(
        || {
            passed = source.read().unwrap().get(id).filter(|e| test(e)).cloned();
            passed.is_some()
        },
        what,
    );
    passed.expect("wait_for returns once the condition holds")
}

/// Polls `condition` every 5 ms for up to 10 s; panics naming `what` on timeout.
pub fn wait_for(condition: impl FnMut() -> bool, what: &str) {
    wait_for_within(Duration::from_secs(10), condition, what);
}

/// [`wait_for`] with a deadline of `limit`, for waits whose length is itself
/// what a test checks (choose it generously: the host may be busy).
pub fn wait_for_within(limit: Duration, mut condition: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs `f` on another thread and waits at most `limit` for it to return
/// (choose it generously: the host may be busy); panics naming `what` if it
/// does not. For "this returns, it does not hang" checks, instead of timing a
/// call against a tight wall-clock bound.
///
/// The thread is not scoped: a call that never returns is left behind (and
/// ends with the test process) while the test fails, instead of the test
/// waiting for it. So `f` owns what it uses (move it in, e.g. a `ShmDir`) and
/// hands back what the caller needs afterwards in its result.
pub fn returns_within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (done, returned) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(f());
    });
    match returned.recv_timeout(limit) {
        Ok(value) => value,
        Err(RecvTimeoutError::Timeout) => panic!("{what} did not return within {limit:?}"),
        Err(RecvTimeoutError::Disconnected) => panic!("{what} panicked"),
    }
}

/// Reader options for tests: a directory listing (or registry read) on
/// every read, and the given `stale_after`.
pub fn test_options(stale_after: Duration) -> engine_state_reader::ReaderOptions {
    engine_state_reader::ReaderOptions {
        freshness: engine_state_reader::Freshness {
            stale_after,
            ..engine_state_reader::Freshness::default()
        },
        rescan_interval: Duration::ZERO,
        cache_digests: false,
    }
}

/// A reader of `uri` with cache digests, rescanning at every read.
pub fn digest_reader(uri: &str) -> Box<dyn engine_state_reader::Source> {
    let options = engine_state_reader::ReaderOptions {
        rescan_interval: Duration::ZERO,
        ..engine_state_reader::ReaderOptions::default()
    }
    .with_cache_digests(true);
    engine_state_reader::open(&engine_state_reader::StateUri::parse(uri).unwrap(), options).unwrap()
}

/// `GET key` (None: no such key).
pub fn get(con: &mut redis::Connection, key: &str) -> Option<Vec<u8>> {
    redis::cmd("GET").arg(key).query(con).unwrap()
}

/// A source for `uri` (shm or Redis) with [`test_options`].
pub fn test_reader(uri: &str, stale_after: Duration) -> Box<dyn engine_state_reader::Source> {
    let uri = engine_state_reader::StateUri::parse(uri).expect("a valid test URI");
    engine_state_reader::open(&uri, test_options(stale_after)).expect("open the test source")
}

/// A publisher of `id` to `uri` every `period_ms`.
pub fn start_publisher(
    uri: &str,
    id: &str,
    period_ms: u64,
) -> Result<engine_state_publisher::Publisher, engine_state_publisher::Error> {
    engine_state_publisher::Publisher::start(
        engine_state_publisher::PublisherConfig::resolve(
            Some(uri),
            Some(id),
            Some(period_ms),
            None,
        )
        .unwrap(),
    )
}

/// A publisher of `id` to `uri` (20 ms period) that has published one
/// snapshot with `num_running` running requests.
pub fn publishing_running(
    uri: &str,
    id: &str,
    num_running: u64,
) -> engine_state_publisher::Publisher {
    let mut publisher = start_publisher(uri, id, 20).unwrap();
    publisher
        .publish(engine_state_shm_format::Snapshot {
            num_running,
            ..engine_state_shm_format::Snapshot::default()
        })
        .unwrap();
    publisher
}

/// espublish of engine `id` at `uri` with `extra` flags, started (its first
/// line read: it is publishing).
pub fn espublish(uri: &str, id: &str, extra: &[&str]) -> Proc {
    let mut proc = Proc::spawn(
        Command::new(bin("espublish"))
            .args(["--uri", uri, "--engine-id", id])
            .args(extra)
            .stdout(Stdio::piped()),
    );
    let line = proc.first_line();
    assert!(
        line.starts_with("espublish: publishing"),
        "espublish did not start: {line:?}"
    );
    proc
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call that never returns fails the check instead of hanging it
    /// (the thread is left parked; it ends with the test process).
    #[test]
    #[should_panic(expected = "a parked call did not return within")]
    fn returns_within_fails_on_a_call_that_never_returns() {
        returns_within(Duration::from_millis(50), "a parked call", || loop {
            std::thread::park();
        });
    }

    #[test]
    fn returns_within_hands_back_the_result() {
        let owned = vec![1, 2, 3];
        let (owned, sum) = returns_within(Duration::from_secs(10), "a sum", move || {
            let sum: i32 = owned.iter().sum();
            (owned, sum)
        });
        assert_eq!((owned.len(), sum), (3, 6));
    }
}
