//! The node agent: Python publishers write shared memory, `esagent` relays
//! to a real redis-server, a Redis reader sees the same snapshots, and
//! /metrics and /healthz answer over HTTP with the right values.

use std::io::Read;
use std::net::TcpStream;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use engine_state_reader::{ReaderOptions, ShmDir, Source, Status};
use engine_state_tests::*;

/// The flags of an agent relaying `dir` to `redis_uri`, then `extra`.
fn relay_flags<'a>(dir: &'a str, redis_uri: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut flags = vec!["--uri", dir, "--redis", redis_uri, "--period-ms", "20"];
    flags.extend(["--stale-after-ms", "500"]);
    flags.extend(extra);
    flags
}

fn file_uri(dir: &std::path::Path) -> String {
    format!("file://{}", dir.display())
}

/// An in-process agent relaying `dir` to `redis_uri`; its HTTP address.
fn agent(dir: &std::path::Path, redis_uri: &str, extra: &[&str]) -> InProcessAgent {
    InProcessAgent::start(&relay_flags(&file_uri(dir), redis_uri, extra))
}

/// `esagent` relaying `dir` to `redis_uri` as a process, started by
/// `command` (esagent itself, or a wrapper that execs it with the arguments
/// appended): for the tests of what only a process has (signals, descriptor
/// limits, stderr); the process and its HTTP address.
fn agent_process(mut command: Command, dir: &std::path::Path, redis_uri: &str) -> (Proc, String) {
    let dir = file_uri(dir);
    let flags = relay_flags(&dir, redis_uri, &["--listen", "127.0.0.1:0"]);
    esagent_process(command.args(flags))
}

fn redis_reader(uri: &str) -> Box<dyn Source> {
    test_reader(uri, Duration::from_millis(500))
}

#[test]
fn agent_relays_shared_memory_to_redis_and_serves_metrics() {
    let redis = RedisServer::start();
    let redis_uri = redis.uri("?prefix=node-a:&ttl_ms=400");
    let dir = tempfile::tempdir().unwrap();
    let publishers: Vec<Proc> = (0..3)
        .map(|i| {
            python_publisher(
                dir.path(),
                &format!("py-{i}"),
                &format!(
                    "pub.publish(num_running={}, num_waiting=2, gpu_blocks_total=100, \
                     gpu_blocks_free=25, pending_prefill_tokens={})",
                    i + 1,
                    1000 * i
                ),
            )
        })
        .collect();
    let (mut agent, addr) = agent_process(Command::new(bin("esagent")), dir.path(), &redis_uri);
    let mut remote = redis_reader(&redis_uri);
    wait_for(
        || {
            let r = remote.read().unwrap();
            r.engines.len() == 3 && r.engines.iter().all(|e| e.snapshot.num_running > 0)
        },
        "three relayed engines",
    );

    // The same snapshots, word for word, as a reader of the files sees.
    let mut local = ShmDir::open(dir.path(), ReaderOptions::default()).unwrap();
    let (here, there) = (local.read().unwrap(), remote.read().unwrap());
    for (a, b) in here.engines.iter().zip(&there.engines) {
        assert_eq!(a.engine_id, b.engine_id);
        assert_eq!(a.snapshot, b.snapshot);
        // A relayed record's generation is its file's creation time
        // (unique per file; the file's own generation is 1 in every
        // fresh file).
        let header = local.header(&a.engine_id).unwrap();
        assert_eq!(b.generation, header.created_unix_ns);
        assert_eq!(b.status, Status::Fresh, "{b:?}");
        assert!(b.heartbeat_age < Duration::from_millis(500), "{b:?}");
    }
    // Another prefix on the same server sees nothing: fleets are separate.
    let other = redis_reader(&redis.uri("?prefix=node-b:")).read().unwrap();
    assert!(other.engines.is_empty());

    // Prometheus metrics, scraped over HTTP.
    let mut metrics = String::new();
    wait_for(
        || {
            metrics = http_get(&addr, "/metrics").1;
            sample(&metrics, "engine_state_engines") == Some(3.0)
                && sample(&metrics, r#"engine_state_num_running{engine="py-2"}"#) == Some(3.0)
                && sample(&metrics, "engine_state_relayed_total").is_some_and(|n| n >= 3.0)
        },
        "gauges of three engines",
    );
    for (series, value) in [
        (r#"engine_state_num_running{engine="py-0"}"#, 1.0),
        (r#"engine_state_num_waiting{engine="py-1"}"#, 2.0),
        (
            r#"engine_state_pending_prefill_tokens{engine="py-2"}"#,
            2000.0,
        ),
        (r#"engine_state_gpu_blocks_usable{engine="py-0"}"#, 100.0),
        (r#"engine_state_gpu_kv_used_frac{engine="py-0"}"#, 0.75),
        (r#"engine_state_status{engine="py-1",status="fresh"}"#, 1.0),
        (r#"engine_state_status{engine="py-1",status="stale"}"#, 0.0),
        ("engine_state_redis_connected", 1.0),
    ] {
        assert_eq!(sample(&metrics, series), Some(value), "{series}\n{metrics}");
    }
    let heartbeat_age = sample(
        &metrics,
        r#"engine_state_heartbeat_age_seconds{engine="py-0"}"#,
    );
    assert!(
        heartbeat_age.is_some_and(|a| (0.0..0.5).contains(&a)),
        "{heartbeat_age:?}"
    );
    assert!(sample(
        &metrics,
        r#"engine_state_capture_age_seconds{engine="py-0"}"#
    )
    .is_some());
    assert!(sample(&metrics, "engine_state_relay_lag_seconds_count").is_some_and(|n| n >= 3.0));
    assert!(sample(&metrics, "engine_state_snapshot_age_seconds_count").is_some_and(|n| n >= 3.0));
    assert!(sample(&metrics, "engine_state_relayed_total").is_some_and(|n| n >= 3.0));
    assert!(metrics.contains("engine_state_relay_lag_seconds_bucket{le=\"0.005\"}"));
    let (code, health) = http_get(&addr, "/healthz");
    assert_eq!(code, 200, "{health}");
    assert!(
        health.starts_with("ok\n") && health.contains("engines: 3"),
        "{health}"
    );
    assert_eq!(http_get(&addr, "/nope").0, 404);

    // A clean close deletes the key; a killed writer's key expires (dead).
    let mut publishers = publishers.into_iter();
    let mut closed = publishers.next().unwrap();
    drop(closed.0.stdin.take()); // the script returns, the Publisher closes
    closed.0.wait().unwrap();
    let mut killed = publishers.next().unwrap();
    killed.kill();
    wait_for(
        || {
            let r = remote.read().unwrap();
            r.get("py-0").is_none() && r.get("py-1").is_some_and(|e| e.status == Status::Dead)
        },
        "py-0 gone and py-1 dead on Redis",
    );
    assert_eq!(
        remote.read().unwrap().get("py-2").unwrap().status,
        Status::Fresh
    );
    // Gauges follow a change (they are set only when their value changed).
    wait_for(
        || {
            metrics = http_get(&addr, "/metrics").1;
            sample(
                &metrics,
                r#"engine_state_status{engine="py-1",status="dead"}"#,
            ) == Some(1.0)
                && sample(
                    &metrics,
                    r#"engine_state_status{engine="py-1",status="fresh"}"#,
                ) == Some(0.0)
        },
        "py-1 dead in the status gauges",
    );
    assert_eq!(
        sample(&metrics, "engine_state_engines"),
        Some(2.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, r#"engine_state_num_running{engine="py-2"}"#),
        Some(3.0)
    );

    // SIGTERM: a clean stop.
    nix::sys::signal::kill(agent.pid(), nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = agent.0.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let stderr = stderr_of(&mut agent);
    assert!(stderr.contains("esagent: stopped"), "{stderr}");
}

#[test]
fn agent_cleanup_removes_dead_writers_files_only_when_enabled() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let mut doomed = python_publisher(dir.path(), "doomed", "pub.publish(num_running=1)");
    let _alive = python_publisher(dir.path(), "alive", "pub.publish(num_running=1)");
    let agent = agent(dir.path(), &redis.uri(""), &["--cleanup-grace-s", "1"]);
    let addr = agent.addr();
    wait_for(
        || http_get(addr, "/healthz").1.contains("engines: 2"),
        "the agent to see both engines",
    );
    doomed.kill();
    wait_for(
        || !dir.path().join("doomed").exists(),
        "the dead writer's file to be removed",
    );
    assert!(dir.path().join("alive").exists());
}

#[test]
fn agent_with_a_wrong_password_fails_clearly_without_leaking_it() {
    let redis = RedisServer::start_with(Some("right-pass-123"));
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("redis://:wrong-pass-456@127.0.0.1:{}/0", redis.port());
    let out = Command::new(bin("esagent"))
        .args(["--uri", &format!("file://{}", dir.path().display())])
        .args(["--redis", &uri, "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("password"), "{stderr}");
    assert!(!stderr.contains("wrong-pass-456"), "{stderr}");
}

/// A Redis user that may connect but not write (ACL: no `EVAL`, no `SET`)
/// is not "unreachable": `/healthz` says the server denied a command, which
/// one, and what to grant — and never shows the password.
#[test]
fn healthz_says_permission_denied_for_a_redis_user_without_the_commands() {
    let redis = RedisServer::start();
    let mut admin = redis.connection();
    let _: () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER",
                "reader-only",
                "on",
                ">acl-pw-789",
                "~*",
                "+ping",
                "+@read",
            ][..],
        )
        .query(&mut admin)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let _engine = steady_publisher(dir.path());
    let uri = format!(
        "redis://reader-only:acl-pw-789@127.0.0.1:{}/0",
        redis.port()
    );
    let agent = agent(dir.path(), &uri, &[]);
    let mut health = (0, String::new());
    wait_for(
        || {
            health = http_get(agent.addr(), "/healthz");
            health.1.contains("redis: permission denied")
        },
        "/healthz to say the relay's commands are denied",
    );
    let (code, text) = health;
    // Still 200: the relay loop runs (as during an outage); the text says
    // what to fix.
    assert_eq!(code, 200, "{text}");
    assert!(
        text.contains("no permissions to run the 'eval' command") && text.contains("+eval"),
        "{text}"
    );
    assert!(!text.contains("unreachable"), "{text}");
    assert!(!text.contains("acl-pw-789"), "password shown: {text}");
}

/// A Python publisher of engine "steady": step 1, 2, … every 10 ms, from a thread.
fn steady_publisher(dir: &std::path::Path) -> Proc {
    let script = "import threading, time\n\
                  def run():\n    \
                      for step in range(1, 10**7):\n        \
                          pub.publish(step=step, num_running=1)\n        \
                          time.sleep(0.01)\n\
                  threading.Thread(target=run, daemon=True).start()";
    python_publisher(dir, "steady", script)
}

/// The step of engine "steady" as a Redis reader sees it, when fresh.
fn relayed_step(remote: &mut Box<dyn Source>) -> Option<u64> {
    remote.read().ok().and_then(|r| {
        r.get("steady")
            .filter(|e| e.is_fresh())
            .map(|e| e.snapshot.step)
    })
}

/// Waits (as [`wait_for`]) until engine "steady" is relayed fresh; its step.
fn wait_relayed(remote: &mut Box<dyn Source>, what: &str) -> u64 {
    let mut step = 0;
    wait_for(
        || {
            step = relayed_step(remote).unwrap_or(0);
            step > 0
        },
        what,
    );
    step
}

#[test]
fn agent_rides_out_a_redis_restart_and_relays_again() {
    let mut redis = RedisServer::start();
    let redis_uri = redis.uri("?prefix=outage:");
    let dir = tempfile::tempdir().unwrap();
    // The agent starts on an empty directory (it polls only once an engine
    // is there) and finds the engine when it appears.
    let agent = agent(dir.path(), &redis_uri, &[]);
    let addr = agent.addr();
    let _publisher = steady_publisher(dir.path());
    let mut remote = redis_reader(&redis_uri);
    let before = wait_relayed(&mut remote, "the engine relayed before the outage");

    redis.kill();
    wait_for(
        || {
            sample(
                &http_get(addr, "/metrics").1,
                "engine_state_redis_connected",
            ) == Some(0.0)
        },
        "the agent to notice the outage",
    );
    let (code, health) = http_get(addr, "/healthz");
    assert_eq!(
        code, 200,
        "the relay keeps running during the outage: {health}"
    );
    assert!(health.contains("redis: unreachable"), "{health}");

    // A restarted server has lost every key and the registry: the agent
    // reconnects, registers the engine again and relays its newest steps.
    redis.restart();
    wait_for(
        || relayed_step(&mut remote).is_some_and(|step| step > before + 10),
        "the engine relayed again after the restart",
    );
    let metrics = http_get(addr, "/metrics").1;
    wait_for(
        || {
            sample(
                &http_get(addr, "/metrics").1,
                "engine_state_redis_connected",
            ) == Some(1.0)
        },
        "the agent to report the connection back",
    );
    assert!(
        sample(&metrics, "engine_state_relay_errors_total").is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
}

#[test]
fn a_redis_that_stops_answering_holds_the_relay_at_most_the_network_timeout() {
    let redis = RedisServer::start();
    let redis_uri = redis.uri("?prefix=frozen:");
    let dir = tempfile::tempdir().unwrap();
    let _publisher = steady_publisher(dir.path());
    let agent = agent(dir.path(), &redis_uri, &[]);
    let addr = agent.addr();
    let mut remote = redis_reader(&redis_uri);
    let before = wait_relayed(&mut remote, "the engine relayed");
    // The first pass ends (its tick) after its write was acknowledged: wait
    // for it, or a freeze right now holds the first pass and /healthz still
    // says "starting".
    wait_for(
        || http_get(addr, "/healthz").0 == 200,
        "the agent healthy before the freeze",
    );

    // Frozen for 3 s: the relay waits for the pipeline's replies for at most
    // the 1 s network timeout, then reconnects in the background, so the
    // agent stays healthy (it tolerates 2 s without a relay period).
    redis.freeze(true);
    let frozen_until = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < frozen_until {
        let (code, health) = http_get(addr, "/healthz");
        assert_eq!(code, 200, "{health}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, health) = http_get(addr, "/healthz");
    assert!(health.contains("redis: unreachable"), "{health}");
    redis.freeze(false);
    wait_for(
        || relayed_step(&mut remote).is_some_and(|step| step > before + 100),
        "the engine relayed again after the thaw",
    );
}

/// More idle connections than the agent may open files: the HTTP side stops
/// accepting at its cap (a quarter of the limit), drops idle connections
/// after its request timeout and backs off failed accepts, so the relay
/// (directory listing, Redis) never runs out of descriptors and the engine
/// stays fresh on Redis; /healthz answers once the flood is gone.
#[test]
fn an_idle_connection_flood_beyond_the_fd_limit_never_stops_the_relay() {
    const LIMIT: usize = 256;
    let redis = RedisServer::start();
    let redis_uri = redis.uri("?prefix=flood:");
    let dir = tempfile::tempdir().unwrap();
    let _publisher = steady_publisher(dir.path());
    // Soft and hard limit lowered: raising the soft limit cannot help.
    let mut sh = Command::new("sh");
    sh.arg("-c")
        .arg(format!("ulimit -n {LIMIT} && exec \"$0\" \"$@\""))
        .arg(bin("esagent"));
    let (agent, addr) = agent_process(sh, dir.path(), &redis_uri);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", agent.pid())).unwrap();
    let open_files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    assert_eq!(
        open_files.split_whitespace().collect::<Vec<_>>()[3..5],
        [LIMIT.to_string(), LIMIT.to_string()],
        "{open_files}"
    );
    let mut remote = redis_reader(&redis_uri);
    let mut step = wait_relayed(&mut remote, "the engine relayed before the flood");

    // From a thread: beyond the agent's cap and the listen backlog a
    // connect waits until the agent drops an idle connection.
    let stop = Arc::new(AtomicBool::new(false));
    let flooder = {
        let (stop, addr) = (stop.clone(), addr.clone());
        std::thread::spawn(move || {
            let mut flood = Vec::new();
            while !stop.load(Ordering::Relaxed) && flood.len() < 2 * LIMIT {
                flood.push(TcpStream::connect(&addr).unwrap());
            }
            flood
        })
    };
    // For 5 s, longer than two of the agent's request timeouts (2 s): idle
    // connections are dropped and queued ones accepted meanwhile. The relay
    // goes on throughout: each new step reaches Redis within the default
    // stale_after (2 s; a shorter pause is invisible to routers, and before
    // the fix the relay stopped for seconds), and the agent stays well
    // under its descriptor limit.
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < until {
        let before = step;
        wait_for_within(
            engine_state_reader::DEFAULT_STALE_AFTER,
            || {
                let reading = remote.read().unwrap();
                step = reading.get("steady").map_or(before, |e| e.snapshot.step);
                step > before
            },
            &format!("a step after {before} relayed during the flood"),
        );
        let fds = std::fs::read_dir(format!("/proc/{}/fd", agent.pid()))
            .unwrap()
            .count();
        assert!(fds < LIMIT / 2, "the agent holds {fds} descriptors");
    }
    stop.store(true, Ordering::Relaxed);
    let flood = flooder.join().unwrap();
    assert!(flood.len() > LIMIT, "only {} connections", flood.len());
    drop(flood);
    let (code, health) = http_get(&addr, "/healthz");
    assert_eq!(code, 200, "{health}");
    assert!(health.starts_with("ok\n"), "{health}");
}

/// A directory that cannot be listed (removed, here) makes /healthz
/// unhealthy with the reason, not "ok, engines: 0"; it is healthy again
/// once the directory is back.
#[test]
fn healthz_is_unhealthy_while_the_directory_cannot_be_listed() {
    let redis = RedisServer::start();
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("engines");
    // A missing directory is created at start (engines may start later).
    let agent = agent(&dir, &redis.uri(""), &[]);
    let addr = agent.addr();
    assert!(dir.is_dir());
    wait_for(|| http_get(addr, "/healthz").0 == 200, "a healthy agent");

    std::fs::remove_dir(&dir).unwrap();
    let mut health = (0, String::new());
    wait_for(
        || {
            health = http_get(addr, "/healthz");
            health.0 == 503
        },
        "/healthz to turn unhealthy",
    );
    assert!(
        health.1.starts_with("cannot read engine-state directory")
            && health.1.contains("No such file"),
        "{}",
        health.1
    );
    assert!(
        !dir.exists(),
        "the agent does not recreate it while running"
    );

    std::fs::create_dir(&dir).unwrap();
    wait_for(
        || http_get(addr, "/healthz").0 == 200,
        "/healthz healthy again",
    );
}

/// SIGTERM → exit within the documented second, even when Redis stopped
/// answering (the relay thread is then stuck in a read for up to the network
/// timeout — 20 s here — and a flush would wait on top of it).
#[test]
fn agent_exits_within_a_second_of_sigterm_even_with_redis_frozen() {
    use nix::sys::signal::{kill, Signal};
    let redis = RedisServer::start();
    // A network timeout far beyond the bound below: an agent that waited
    // for its stuck relay thread could not pass.
    let redis_uri = redis.uri("?prefix=stop:&timeout_ms=20000");
    let dir = tempfile::tempdir().unwrap();
    let _publisher = steady_publisher(dir.path());
    for frozen in [false, true] {
        let (mut agent, _addr) =
            agent_process(Command::new(bin("esagent")), dir.path(), &redis_uri);
        wait_relayed(&mut redis_reader(&redis_uri), "the engine relayed");
        if frozen {
            redis.freeze(true);
            // Nothing outside the agent's process shows its relay blocked
            // on the frozen server: time for it to get there.
            std::thread::sleep(Duration::from_millis(300)); // the relay is stuck now
        }
        let signalled = std::time::Instant::now();
        kill(agent.pid(), Signal::SIGTERM).unwrap();
        let status = agent.0.wait().unwrap();
        let took = signalled.elapsed();
        redis.freeze(false);
        assert!(status.success(), "{status:?}");
        // The promise is 1 s; the rest is slack for a loaded machine, and
        // still a quarter of the 20 s a stuck read could last.
        assert!(
            took < Duration::from_secs(5),
            "frozen Redis: {frozen}: exit took {took:?}"
        );
        eprintln!("SIGTERM to exit, Redis frozen: {frozen}: {took:?}");
    }
}

/// A password in `--redis` is visible to every user in `ps`: esagent warns
/// (without printing it) and recommends the environment variable, which
/// draws no warning.
#[test]
fn a_redis_password_on_the_command_line_draws_a_warning() {
    let redis = RedisServer::start_with(Some("right-pass-123"));
    let dir = tempfile::tempdir().unwrap();
    // A wrong password makes esagent exit at once, after the warning.
    let uri = format!("redis://:wrong-pass-456@127.0.0.1:{}/0", redis.port());
    let run = |on_command_line: bool| {
        let mut command = Command::new(bin("esagent"));
        command
            .args(["--uri", &format!("file://{}", dir.path().display())])
            .args(["--listen", "127.0.0.1:0"]);
        if on_command_line {
            command.args(["--redis", &uri]);
        } else {
            command.env("AGENTIC_ENGINE_STATE_REDIS_URI", &uri);
        }
        let out = command.output().unwrap();
        assert!(!out.status.success());
        String::from_utf8(out.stderr).unwrap()
    };
    let stderr = run(true);
    assert!(
        stderr.contains("password is on the command line")
            && stderr.contains("AGENTIC_ENGINE_STATE_REDIS_URI"),
        "{stderr}"
    );
    assert!(!stderr.contains("wrong-pass-456"), "{stderr}");
    let stderr = run(false);
    assert!(!stderr.contains("command line"), "{stderr}");
    assert!(stderr.contains("password"), "{stderr}");
}

/// Out of descriptors, `accept` fails (EMFILE): esagent backs off and logs
/// it once (until accepts have worked for a second) instead of at every
/// retry, and serves again once descriptors are free.
#[test]
fn failed_accepts_back_off_and_are_logged_once() {
    use nix::sys::signal::{kill, Signal};
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    // The agent's own descriptors (a first run counts them) plus two.
    let own = {
        let (first, addr) = agent_process(Command::new(bin("esagent")), dir.path(), &redis.uri(""));
        wait_for(|| http_get(&addr, "/healthz").0 == 200, "a healthy agent");
        std::fs::read_dir(format!("/proc/{}/fd", first.pid()))
            .unwrap()
            .filter(|fd| {
                // Inherited high descriptors do not take low numbers.
                fd.as_ref()
                    .unwrap()
                    .file_name()
                    .to_str()
                    .unwrap()
                    .parse::<u32>()
                    .unwrap()
                    < 64
            })
            .count()
    };
    let mut sh = Command::new("sh");
    sh.arg("-c")
        .arg(format!("ulimit -n {} && exec \"$0\" \"$@\"", own + 2))
        .arg(bin("esagent"));
    let (mut agent, addr) = agent_process(sh, dir.path(), &redis.uri(""));
    let stderr = Arc::new(std::sync::Mutex::new(String::new()));
    let collector = {
        let (stderr, mut pipe) = (stderr.clone(), agent.0.stderr.take().unwrap());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = pipe.read(&mut buf) {
                stderr
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
    };
    let said = |what: &str| stderr.lock().unwrap().contains(what);
    let flood: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    wait_for(|| said("accept failed"), "the first failed accept");
    // Held a while longer, so that the retries (10 ms, 20 ms, … apart) fail
    // too; they are counted, not logged.
    std::thread::sleep(Duration::from_secs(1));
    drop(flood);
    // Once accepts have worked for a second, the next one reports it.
    wait_for(
        || http_get(&addr, "/healthz").0 == 200 && said("accepting HTTP connections again"),
        "a healthy agent that reports accepting again",
    );
    kill(agent.pid(), Signal::SIGTERM).unwrap();
    assert!(agent.0.wait().unwrap().success());
    collector.join().unwrap();
    let stderr = stderr.lock().unwrap().clone();
    assert_eq!(
        stderr.matches("accept failed: Too many open files").count(),
        1,
        "{stderr}"
    );
    let failures: u64 = stderr
        .split("accepting HTTP connections again (")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of failed accepts: {stderr}"));
    assert!(
        failures >= 2,
        "{failures} failed accept(s): nothing to log once: {stderr}"
    );
}
