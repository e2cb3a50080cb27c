//! A real `redis-server` on a free loopback port, killed when dropped.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::Proc;

/// A `redis-server` child process for one test.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    password: Option<String>,
    /// Serve TLS only (self-signed certificate made with `openssl`).
    tls: bool,
    dir: tempfile::TempDir,
    proc: Option<Proc>,
}

/// The `redis-server` executable: `$REDIS_SERVER`, else the one on the PATH.
pub fn redis_server_path() -> PathBuf {
    if let Some(path) = std::env::var_os("REDIS_SERVER") {
        return PathBuf::from(path);
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("redis-server"))
            .find(|p| p.exists())
    });
    found.unwrap_or_else(|| {
        panic!(
            "redis-server is not installed: install it (Debian/Ubuntu: apt-get install \
             redis-server; .ci/run does) or point REDIS_SERVER at the executable"
        )
    })
}

/// A free TCP port on 127.0.0.1 (bound to port 0, then released): for a
/// server to start on, or as an address nobody answers on (never a fixed
/// port such as 1, which something on the host may listen on).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

impl RedisServer {
    /// Starts a server without a password and waits until it answers PING.
    pub fn start() -> RedisServer {
        RedisServer::start_with(None)
    }

    /// Starts a server with `requirepass` (when given).
    pub fn start_with(password: Option<&str>) -> RedisServer {
        RedisServer::start_on(free_port(), password)
    }

    /// Starts a server on `port` (e.g. one a client already tries to reach).
    pub fn start_on(port: u16, password: Option<&str>) -> RedisServer {
        RedisServer::launch(port, password, false)
    }

    /// Starts a TLS-only server with a fresh self-signed certificate; its
    /// [`RedisServer::uri`] is `rediss://…#insecure` (no CA to check against).
    pub fn start_tls() -> RedisServer {
        RedisServer::launch(free_port(), None, true)
    }

    fn launch(port: u16, password: Option<&str>, tls: bool) -> RedisServer {
        let mut server = RedisServer {
            port,
            tls,
            password: password.map(str::to_owned),
            dir: tempfile::tempdir().expect("temporary directory"),
            proc: None,
        };
        server.restart();
        server
    }

    /// `redis://[:password@]127.0.0.1:<port>/0` plus `suffix` (e.g. `?prefix=x:`).
    pub fn uri(&self, suffix: &str) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let fragment = if self.tls { "#insecure" } else { "" };
        match &self.password {
            Some(pw) => format!(
                "{scheme}://:{pw}@127.0.0.1:{}/0{suffix}{fragment}",
                self.port
            ),
            None => format!("{scheme}://127.0.0.1:{}/0{suffix}{fragment}", self.port),
        }
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A plain connection, for tests that put things into Redis by hand.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.uri(""))
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
            .expect("connect to the test redis-server")
    }

    /// Kills the server (SIGKILL: like a crash or a network cut).
    pub fn kill(&mut self) {
        if let Some(mut proc) = self.proc.take() {
            proc.kill();
        }
    }

    /// Freezes (`true`, SIGSTOP) or thaws (`false`, SIGCONT) the server: it
    /// keeps its connections and stops answering, like an overloaded or
    /// paused server. Returns once the server is stopped (resp. no longer
    /// stopped), so nothing sent after a freeze is read before the thaw.
    pub fn freeze(&self, frozen: bool) {
        let proc = self.proc.as_ref().expect("a running server");
        let signal = if frozen {
            nix::sys::signal::Signal::SIGSTOP
        } else {
            nix::sys::signal::Signal::SIGCONT
        };
        nix::sys::signal::kill(proc.pid(), signal).expect("signal redis-server");
        // The signal acts asynchronously: wait until /proc says so.
        let stat = format!("/proc/{}/stat", proc.pid());
        let stopped = || {
            let text = std::fs::read_to_string(&stat).unwrap_or_default();
            // `pid (comm) S …`: the state follows the last ')'.
            let state = text.rsplit_once(") ").map(|(_, rest)| &rest[..1]);
            state == Some("T")
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while stopped() != frozen {
            assert!(
                Instant::now() < deadline,
                "redis-server did not {} within 10 s",
                if frozen { "stop" } else { "continue" }
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// (Re)starts the server on the same port, empty, and waits for PING.
    pub fn restart(&mut self) {
        self.kill();
        let mut command = Command::new(redis_server_path());
        if self.tls {
            let (cert, key) = (
                self.dir.path().join("cert.pem"),
                self.dir.path().join("key.pem"),
            );
            if !cert.exists() {
                let made = Command::new("openssl")
                    .args([
                        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    ])
                    .args(["-subj", "/CN=127.0.0.1", "-keyout"])
                    .arg(&key)
                    .arg("-out")
                    .arg(&cert)
                    .stderr(Stdio::null())
                    .status()
                    .expect("openssl (needed to make a test certificate) is not installed");
                assert!(made.success(), "openssl could not make a test certificate");
            }
            command
                .args(["--port", "0", "--tls-port", &self.port.to_string()])
                .arg("--tls-cert-file")
                .arg(&cert)
                .arg("--tls-key-file")
                .arg(&key)
                .arg("--tls-ca-cert-file")
                .arg(&cert)
                .args(["--tls-auth-clients", "no"]);
        } else {
            command.args(["--port", &self.port.to_string()]);
        }
        command
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null());
        if let Some(pw) = &self.password {
            command.args(["--requirepass", pw]);
        }
        self.proc = Some(Proc::spawn(&mut command));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let ping = redis::Client::open(self.uri(""))
                .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
            if ping.is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not answer PING within 10 s: {ping:?}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
