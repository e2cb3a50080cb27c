//! `esagent` creates a missing state directory at start and says so once:
//! a mistyped `--uri` would otherwise relay an empty directory in silence.

use std::process::{Command, Stdio};

use engine_state_tests::*;

#[test]
fn esagent_says_once_that_it_created_a_missing_directory() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("not/yet/there");
    let run = || {
        let unreachable = format!("redis://127.0.0.1:{}/0", free_port());
        let mut agent = Proc::spawn(
            Command::new(bin("esagent"))
                .args(["--uri", &format!("file://{}", dir.display())])
                // Unreachable: the agent runs anyway (and says so).
                .args(["--redis", &unreachable, "--listen", "127.0.0.1:0"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
        );
        assert!(agent.first_line().contains("/metrics"));
        nix::sys::signal::kill(agent.pid(), nix::sys::signal::Signal::SIGTERM).unwrap();
        assert!(agent.0.wait().unwrap().success());
        stderr_of(&mut agent)
    };
    let stderr = run();
    assert!(dir.is_dir());
    let said = format!(
        "created the missing engine-state directory {}",
        dir.display()
    );
    assert_eq!(stderr.matches(&said).count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "AGENTIC_ENGINE_STATE_URI=file://{}",
            dir.display()
        )),
        "{stderr}"
    );
    // It exists now: nothing to say.
    let stderr = run();
    assert!(!stderr.contains("created the missing"), "{stderr}");
}
