//! esagent for the tests: in-process ([`InProcessAgent`]) unless the process
//! is the point (signals, descriptor limits, exit codes, what it logs on
//! stderr: [`esagent_process`]), and what its HTTP side answers.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::thread::JoinHandle;

use clap::Parser;
use engine_state_agent::{Agent, Args, CancellationToken};

use crate::Proc;

/// An esagent running in this process (`Agent::bind`, then `Agent::run` on
/// a thread of its own with a tokio runtime), stopped when dropped. Each
/// agent has its own metrics, so tests running in parallel do not mix them.
#[derive(Debug)]
pub struct InProcessAgent {
    addr: String,
    shutdown: CancellationToken,
    thread: Option<JoinHandle<()>>,
}

impl InProcessAgent {
    /// Starts an agent configured by `args`, esagent's flags (`--listen
    /// 127.0.0.1:0` unless given), as the binary parses them (the
    /// environment included); returns once it is bound.
    pub fn start(args: &[&str]) -> InProcessAgent {
        let mut argv = vec!["esagent"];
        if !args.contains(&"--listen") {
            argv.extend(["--listen", "127.0.0.1:0"]);
        }
        argv.extend(args);
        let config = Args::try_parse_from(&argv)
            .unwrap_or_else(|e| panic!("esagent flags {argv:?}: {e}"))
            .into_config()
            .unwrap_or_else(|e| panic!("esagent flags {argv:?}: {e}"));
        let shutdown = CancellationToken::new();
        let (bound, addr) = std::sync::mpsc::channel();
        let token = shutdown.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a tokio runtime");
            runtime.block_on(async {
                let agent = match Agent::bind(config).await {
                    Ok(agent) => agent,
                    Err(e) => return bound.send(Err(e.to_string())).unwrap(),
                };
                bound.send(Ok(agent.local_addr().to_string())).unwrap();
                agent.run(token).await.expect("the agent runs");
            });
            // As esagent: the relay thread may be stuck in a call to a Redis
            // that stopped answering; `run` has given up on it.
            runtime.shutdown_background();
        });
        let addr = addr
            .recv()
            .expect("the agent thread reports its address")
            .unwrap_or_else(|e| panic!("esagent did not start: {e}"));
        InProcessAgent {
            addr,
            shutdown,
            thread: Some(thread),
        }
    }

    /// The address of `/metrics` and `/healthz` (`host:port`).
    pub fn addr(&self) -> &str {
        &self.addr
    }
}

impl Drop for InProcessAgent {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(thread) = self.thread.take() {
            // Not in a panicking test: a second panic would abort.
            if thread.join().is_err() && !std::thread::panicking() {
                panic!("the agent thread panicked");
            }
        }
    }
}

/// esagent started by `command` (esagent itself, or a wrapper that execs it
/// with its arguments), stdout and stderr piped: the process and its HTTP
/// address, read off the end of the first line of its stdout.
pub fn esagent_process(command: &mut Command) -> (Proc, String) {
    let mut proc = Proc::spawn(command.stdout(Stdio::piped()).stderr(Stdio::piped()));
    let line = proc.first_line();
    let addr = line
        .rsplit("http://")
        .next()
        .and_then(|rest| rest.strip_suffix("/metrics\n"))
        .unwrap_or_else(|| panic!("esagent did not print its address: {line:?}"))
        .to_owned();
    (proc, addr)
}

/// The whole stderr of a child spawned with it piped (read to its end: the
/// child has exited or closes it).
pub fn stderr_of(proc: &mut Proc) -> String {
    let mut stderr = String::new();
    proc.0
        .stderr
        .take()
        .expect("a piped stderr")
        .read_to_string(&mut stderr)
        .expect("read the child's stderr");
    stderr
}

/// One HTTP GET: (status code, body).
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, body.to_owned())
}

/// The value of the Prometheus sample whose name-and-labels are exactly
/// `series`.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok())?
    })
}
