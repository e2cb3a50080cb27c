//! `esagent` without a Redis URI runs in metrics-only mode and says so at
//! every start: a Redis URI that went missing (a secret not mounted, a
//! renamed variable) must not pass for a choice.

use std::process::{Command, Stdio};

use engine_state_tests::*;

fn stderr_of_a_run(redis: Option<&str>) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(bin("esagent"));
    command
        .args(["--uri", &format!("file://{}", dir.path().display())])
        .args(["--listen", "127.0.0.1:0"])
        .env_remove(engine_state_settings::REDIS_URI_ENV)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(uri) = redis {
        command.args(["--redis", uri]);
    }
    let mut agent = Proc::spawn(&mut command);
    assert!(agent.first_line().contains("/metrics"));
    nix::sys::signal::kill(agent.pid(), nix::sys::signal::Signal::SIGTERM).unwrap();
    assert!(agent.0.wait().unwrap().success());
    stderr_of(&mut agent)
}

#[test]
fn esagent_without_redis_warns_that_nothing_is_relayed() {
    let stderr = stderr_of_a_run(None);
    assert_eq!(stderr.matches("metrics-only mode").count(), 1, "{stderr}");
    assert!(
        stderr.contains(engine_state_settings::REDIS_URI_ENV),
        "{stderr}"
    );
    let redis = RedisServer::start();
    let stderr = stderr_of_a_run(Some(&redis.uri("?prefix=m:")));
    assert!(!stderr.contains("metrics-only mode"), "{stderr}");
}
